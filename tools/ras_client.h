/*
 * `braid ras`: queries a running job's monitor (NCCL's RAS client protocol), with the flags of NCCL's own
 * client (-f text|json, -h HOST, -p PORT, -t SECS, -v, -m [GROUPS]) and --watch SECONDS for a view that
 * refreshes. Without -h and -p it connects to NCCL_RAS_ADDR (localhost:28028 by default).
 */
#ifndef BRAID_TOOLS_RAS_CLIENT_H
#define BRAID_TOOLS_RAS_CLIENT_H

/* `braid ras [options]`: returns the exit status (0, 1 when the job cannot be reached or answers badly, 2 on
 * a usage error). */
int ras_main(int argc, char **argv);

#endif
