# How Braid builds and embeds GPU code: the architectures (BRAID_CUDA_ARCHS) and braid_fatbin().
#
# BRAID_CUDA_ARCHS lists compute capabilities without the dot ("80;90", or "80,90"), or says "native" (the
# GPUs of the machine that builds). Each gets a cubin, and the highest also gets PTX, which GPUs newer than
# every cubin compile when they load it. Left empty (the default), it is every architecture the installed nvcc
# builds from sm_80 up, one per major version: a cubin built for X.y runs on every X.z with z >= y, so sm_80
# serves 8.6, 8.7 and 8.9 too and sm_100 serves 10.3. With CUDA 13.0 that is 80;90;100;110;120 and PTX of 120.
#
# A fatbin is made in steps that run in parallel (make -j, ninja): nvcc makes the PTX of the highest
# architecture and ptxas its cubin, one nvcc per other architecture makes its cubin, then fatbinary puts them
# together. Each step prints a line when it starts and, through BraidStep.cmake, its time when it ends; a
# fatbin is rebuilt only when its sources change. The kernels stay one translation unit: split into several,
# nvcc compiles the general kernel's entry points into different machine code (it inlines differently). With
# one architecture, ptxas can instead compile groups of the entry points in processes side by side (GROUPS),
# each into a fatbin of its own: ptxas compiles every entry point on its own, so the machine code is the same
# as from one process, and each process holds about half the memory.

set(BRAID_CUDA_ARCHS "$ENV{BRAID_CUDA_ARCHS}" CACHE STRING
  "GPU architectures of the kernels: 80;90, native (this machine's GPUs), or empty: every one nvcc builds from sm_80 up, one per major version")

# The default architectures: nvcc's list of real architectures from sm_80 up, the lowest of each major version.
function(braid_default_archs out)
  execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --list-gpu-code OUTPUT_VARIABLE codes RESULT_VARIABLE rc
    ERROR_QUIET)
  string(REGEX MATCHALL "sm_[0-9]+\n" codes "${codes}\n")
  set(archs)
  set(majors)
  foreach(code ${codes})
    string(REGEX REPLACE "sm_([0-9]+)\n" "\\1" arch "${code}")
    math(EXPR major "${arch} / 10")
    if(arch GREATER_EQUAL 80)
      list(APPEND archs ${arch})
    endif()
  endforeach()
  list(SORT archs COMPARE NATURAL)
  set(picked)
  foreach(arch ${archs})
    math(EXPR major "${arch} / 10")
    if(NOT major IN_LIST majors)
      list(APPEND majors ${major})
      list(APPEND picked ${arch})
    endif()
  endforeach()
  if(NOT rc EQUAL 0 OR NOT picked)
    set(picked 80 90) # an nvcc too old to list its architectures
  endif()
  set(${out} ${picked} PARENT_SCOPE)
endfunction()

# "native": the GPUs of this machine, as nvcc's own query finds them.
function(braid_native_archs out)
  get_filename_component(bin ${CMAKE_CUDA_COMPILER} DIRECTORY)
  execute_process(COMMAND ${bin}/__nvcc_device_query OUTPUT_VARIABLE found RESULT_VARIABLE rc ERROR_VARIABLE err)
  string(REGEX MATCHALL "[0-9]+" found "${found}")
  if(NOT rc EQUAL 0 OR NOT found)
    message(FATAL_ERROR "BRAID_CUDA_ARCHS=native: no GPU found here (${err}); name the architectures instead")
  endif()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

if(BRAID_CUDA_ARCHS STREQUAL "native")
  braid_native_archs(braid_archs)
elseif(BRAID_CUDA_ARCHS)
  string(REPLACE "," ";" braid_archs "${BRAID_CUDA_ARCHS}")
  foreach(arch ${braid_archs})
    if(NOT arch MATCHES "^[0-9]+[af]?$")
      message(FATAL_ERROR "BRAID_CUDA_ARCHS: '${arch}' is not a compute capability such as 80 or 90")
    endif()
  endforeach()
else()
  braid_default_archs(braid_archs)
endif()
list(SORT braid_archs COMPARE NATURAL)
list(REMOVE_DUPLICATES braid_archs)
list(GET braid_archs -1 braid_top_arch)
string(REGEX REPLACE "[af]$" "" braid_ptx_arch "${braid_top_arch}")
list(LENGTH braid_archs braid_narchs)
# What the fatbins carry, in words (`braid info`, and the error on a GPU none of them runs on).
set(BRAID_ARCHS_TEXT)
foreach(arch ${braid_archs})
  string(APPEND BRAID_ARCHS_TEXT "sm_${arch} ")
endforeach()
string(APPEND BRAID_ARCHS_TEXT "compute_${braid_ptx_arch}")

# ptxas compiles an architecture's entry points on BRAID_PTXAS_THREADS threads (--split-compile, shared among
# the processes of GROUPS; the machine code is the same as on one thread, each thread holds up to 4 GB). By
# default: the cores, up to 4, when the kernels are built for one architecture; 1 for several, which the build
# already compiles side by side.
cmake_host_system_information(RESULT braid_cores QUERY NUMBER_OF_LOGICAL_CORES)
if(braid_narchs EQUAL 1 AND braid_cores GREATER 1)
  set(braid_threads ${braid_cores})
  if(braid_threads GREATER 4)
    set(braid_threads 4)
  endif()
else()
  set(braid_threads 1)
endif()
set(BRAID_PTXAS_THREADS "" CACHE STRING "ptxas threads per architecture (empty: the cores up to 4 for one architecture, else 1)")
if(BRAID_PTXAS_THREADS)
  set(braid_threads ${BRAID_PTXAS_THREADS})
endif()

get_filename_component(braid_cuda_bin ${CMAKE_CUDA_COMPILER} DIRECTORY)
find_program(BRAID_FATBINARY fatbinary HINTS ${braid_cuda_bin} NO_DEFAULT_PATH)
find_program(BRAID_FATBINARY fatbinary)
find_program(BRAID_PTXAS ptxas HINTS ${braid_cuda_bin} NO_DEFAULT_PATH)
find_program(BRAID_PTXAS ptxas)
if(NOT BRAID_FATBINARY OR NOT BRAID_PTXAS)
  message(FATAL_ERROR "Braid: no fatbinary or ptxas beside ${CMAKE_CUDA_COMPILER}")
endif()

# braid_fatbin(NAME SOURCE SYMBOL INCLUDES OUT_S [DEPENDS files...] [FLAGS nvcc flags...] [GROUPS entries...])
# makes target NAME build the fatbin of SOURCE (INCLUDES: a list of include folders) and sets OUT_S to the
# assembler file that embeds it as SYMBOL and SYMBOL_size (src/device/fatbin.S.in). With GROUPS (each a
# comma-separated list of entry points) and one architecture, it builds a fatbin per group instead, embedded
# as SYMBOL_0, SYMBOL_1, ..., the first with the PTX of every entry point; OUT_S then lists their assembler
# files, and NAME_SYMBOLS (set in the caller) their symbols.
function(braid_fatbin name source symbol includes out_s)
  cmake_parse_arguments(PARSE_ARGV 5 fb "" "" "DEPENDS;FLAGS;GROUPS")
  set(dir ${CMAKE_BINARY_DIR}/fatbin)
  set(braid_step ${CMAKE_SOURCE_DIR}/cmake/BraidStep.cmake)
  set(nvcc ${CMAKE_CUDA_COMPILER_LAUNCHER} ${CMAKE_CUDA_COMPILER} -O3 -std=c++17 ${fb_FLAGS})
  foreach(inc ${includes})
    list(APPEND nvcc -I${inc})
  endforeach()
  set(groups "")
  if(fb_GROUPS AND braid_narchs EQUAL 1)
    set(groups ${fb_GROUPS})
  endif()
  list(LENGTH groups ngroups)
  set(images)
  set(parts)
  if(ngroups GREATER 0)
    math(EXPR nsteps "${ngroups} + 1")
  else()
    math(EXPR nsteps "${braid_narchs} + 1")
  endif()
  set(ptx ${dir}/${name}.compute_${braid_ptx_arch}.ptx)
  add_custom_command(OUTPUT ${ptx}
    COMMAND ${CMAKE_COMMAND} "-DSTEP=${name}: PTX for compute_${braid_ptx_arch}" -P ${braid_step}
            ${nvcc} -ptx -arch=compute_${braid_ptx_arch} -o ${ptx} ${source}
    DEPENDS ${source} ${fb_DEPENDS}
    COMMENT "${name}: PTX for compute_${braid_ptx_arch} (1 of ${nsteps})"
    VERBATIM)
  # The options nvcc records for the PTX's compilation at load time when it makes a fatbin itself.
  set(cicc_options "--cicc-cmdline=-ftz=0 -prec_div=1 -prec_sqrt=1 -fmad=1 ")
  if(ngroups GREATER 0)
    # One architecture in groups of entry points, a ptxas process and a fatbin each.
    math(EXPR threads "${braid_threads} / ${ngroups}")
    if(threads LESS 1)
      set(threads 1)
    endif()
    string(REGEX REPLACE "[af]$" "" sm "${braid_top_arch}")
    set(embeds)
    set(symbols)
    set(i 0)
    foreach(group ${groups})
      math(EXPR step "${i} + 2")
      set(cubin ${dir}/${name}_${i}.sm_${braid_top_arch}.cubin)
      set(fatbin ${dir}/${name}_${i}.fatbin)
      add_custom_command(OUTPUT ${cubin}
        COMMAND ${CMAKE_COMMAND} "-DSTEP=${name}: cubin ${i} for sm_${braid_top_arch}" -P ${braid_step}
                ${BRAID_PTXAS} -arch=sm_${braid_top_arch} -m64 --entry ${group} --split-compile=${threads} ${ptx}
                -o ${cubin}
        DEPENDS ${ptx}
        COMMENT "${name}: cubin ${i} for sm_${braid_top_arch}: ${group} (${step} of ${nsteps})"
        VERBATIM)
      set(image --image3=kind=elf,sm=${sm},file=${cubin})
      if(i EQUAL 0)
        list(APPEND image --image3=kind=ptx,sm=${braid_ptx_arch},file=${ptx})
      endif()
      # compressed, as fatbinary compresses a cubin the size of all entry points' on its own
      add_custom_command(OUTPUT ${fatbin}
        COMMAND ${BRAID_FATBINARY} --create=${fatbin} -64 --compress-all ${cicc_options} ${image}
        DEPENDS ${cubin} ${ptx}
        COMMENT "${name}: fatbin ${i} of ${BRAID_ARCHS_TEXT}"
        VERBATIM)
      list(APPEND parts ${fatbin})
      set(FATBIN_SYMBOL ${symbol}_${i})
      set(FATBIN_FILE ${fatbin})
      set(embed ${dir}/${name}_${i}.S)
      configure_file(${CMAKE_SOURCE_DIR}/src/device/fatbin.S.in ${embed} @ONLY)
      set_source_files_properties(${embed} PROPERTIES OBJECT_DEPENDS ${fatbin})
      list(APPEND embeds ${embed})
      list(APPEND symbols ${symbol}_${i})
      math(EXPR i "${i} + 1")
    endforeach()
    add_custom_target(${name} DEPENDS ${parts})
    set(${out_s} ${embeds} PARENT_SCOPE)
    set(${name}_SYMBOLS ${symbols} PARENT_SCOPE)
    return()
  endif()
  set(fatbin ${dir}/${name}.fatbin)
  set(embed ${dir}/${name}.S)
  set(step 1)
  foreach(arch ${braid_archs})
    math(EXPR step "${step} + 1")
    set(cubin ${dir}/${name}.sm_${arch}.cubin)
    string(REGEX REPLACE "[af]$" "" sm "${arch}")
    if(arch STREQUAL braid_ptx_arch)
      # The highest architecture's cubin from the PTX above, as nvcc makes it, without a second front end run.
      add_custom_command(OUTPUT ${cubin}
        COMMAND ${CMAKE_COMMAND} "-DSTEP=${name}: cubin for sm_${arch}" -P ${braid_step}
                ${BRAID_PTXAS} -arch=sm_${arch} -m64 --split-compile=${braid_threads} ${ptx} -o ${cubin}
        DEPENDS ${ptx}
        COMMENT "${name}: cubin for sm_${arch} (${step} of ${nsteps})"
        VERBATIM)
    else()
      add_custom_command(OUTPUT ${cubin}
        COMMAND ${CMAKE_COMMAND} "-DSTEP=${name}: cubin for sm_${arch}" -P ${braid_step}
                ${nvcc} -cubin -gencode arch=compute_${arch},code=sm_${arch} -Xptxas --split-compile=${braid_threads}
                -o ${cubin} ${source}
        DEPENDS ${source} ${fb_DEPENDS}
        COMMENT "${name}: cubin for sm_${arch} (${step} of ${nsteps})"
        VERBATIM)
    endif()
    list(APPEND parts ${cubin})
    list(APPEND images --image3=kind=elf,sm=${sm},file=${cubin})
  endforeach()
  add_custom_command(OUTPUT ${fatbin}
    COMMAND ${BRAID_FATBINARY} --create=${fatbin} -64 ${cicc_options}
            ${images} --image3=kind=ptx,sm=${braid_ptx_arch},file=${ptx}
    DEPENDS ${parts} ${ptx}
    COMMENT "${name}: fatbin of ${BRAID_ARCHS_TEXT}"
    VERBATIM)
  add_custom_target(${name} DEPENDS ${fatbin})
  set(FATBIN_SYMBOL ${symbol})
  set(FATBIN_FILE ${fatbin})
  configure_file(${CMAKE_SOURCE_DIR}/src/device/fatbin.S.in ${embed} @ONLY)
  set_source_files_properties(${embed} PROPERTIES OBJECT_DEPENDS ${fatbin})
  set(${out_s} ${embed} PARENT_SCOPE)
  set(${name}_SYMBOLS ${symbol} PARENT_SCOPE)
endfunction()
