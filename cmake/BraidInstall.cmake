# What `cmake --install` puts where, laid out as NCCL's packages are: include/nccl.h, lib/libnccl.so.2.28.9 and
# its links, lib/libnccl_static.a, lib/pkgconfig/nccl.pc, bin/braid, and a CMake package (find_package(Braid)
# or find_package(NCCL)). Every installed file finds the others relative to itself, so `cmake --install
# --prefix` and the packages below may put the tree anywhere.
#
# Packages (cpack -G DEB, in the build folder): "braid" (the library and the tool) and "braid-dev" (headers,
# static library, pkg-config and CMake files). By default they install under /opt/braid, beside NVIDIA's
# libnccl2 / libnccl-dev, and a program picks Braid with LD_LIBRARY_PATH=/opt/braid/lib. Configured with
# -DBRAID_DEB_REPLACE_NCCL=ON (and -DCMAKE_INSTALL_PREFIX=/usr) they are named libnccl2-braid and
# libnccl-braid-dev, install into the system's library folder, and replace NVIDIA's packages, whose names they
# provide.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

option(BRAID_DEB_REPLACE_NCCL "Packages that replace NVIDIA's libnccl2/libnccl-dev instead of installing beside them" OFF)

set(NCCL_API_VERSION 2.28.9)
set(PROJECT_NCCL_MAJOR 2)
set(PROJECT_NCCL_MINOR 28)
set(PROJECT_NCCL_PATCH 9)
set(braid_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake)

install(TARGETS nccl EXPORT BraidTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(TARGETS nccl_static EXPORT BraidTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(TARGETS braid RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(FILES include/nccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/braid COMPONENT runtime)

# nccl.pc names its folders relative to where it lies (${pcfiledir}).
file(RELATIVE_PATH braid_pc_up /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" braid_pc_up "${braid_pc_up}")
set(braid_pc_prefix "\${pcfiledir}/${braid_pc_up}")
set(braid_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
set(braid_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
configure_file(cmake/nccl.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/nccl.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/nccl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

install(EXPORT BraidTargets NAMESPACE Braid:: DESTINATION ${braid_cmake_dir}/Braid COMPONENT dev)
configure_package_config_file(cmake/BraidConfig.cmake.in ${CMAKE_BINARY_DIR}/cmake/BraidConfig.cmake
  INSTALL_DESTINATION ${braid_cmake_dir}/Braid)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/BraidConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
configure_file(cmake/NCCLConfig.cmake.in ${CMAKE_BINARY_DIR}/cmake/NCCLConfig.cmake @ONLY)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/NCCLConfigVersion.cmake
  VERSION ${NCCL_API_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/BraidConfig.cmake ${CMAKE_BINARY_DIR}/cmake/BraidConfigVersion.cmake
  DESTINATION ${braid_cmake_dir}/Braid COMPONENT dev)
install(FILES ${CMAKE_BINARY_DIR}/cmake/NCCLConfig.cmake ${CMAKE_BINARY_DIR}/cmake/NCCLConfigVersion.cmake
  DESTINATION ${braid_cmake_dir}/NCCL COMPONENT dev)

# Debian packages.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Braid maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Collective communication library with NCCL's API and ABI (NCCL ${NCCL_API_VERSION})")
set(CPACK_RESOURCE_FILE_LICENSE ${CMAKE_SOURCE_DIR}/LICENSE)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6")
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
if(BRAID_DEB_REPLACE_NCCL)
  set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libnccl2-braid)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_PROVIDES "libnccl2 (= ${NCCL_API_VERSION})")
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONFLICTS libnccl2)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_REPLACES libnccl2)
  set(CPACK_DEBIAN_DEV_PACKAGE_NAME libnccl-braid-dev)
  set(CPACK_DEBIAN_DEV_PACKAGE_PROVIDES "libnccl-dev (= ${NCCL_API_VERSION})")
  set(CPACK_DEBIAN_DEV_PACKAGE_CONFLICTS libnccl-dev)
  set(CPACK_DEBIAN_DEV_PACKAGE_REPLACES libnccl-dev)
  set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libnccl2-braid (= ${PROJECT_VERSION})")
else()
  set(CPACK_PACKAGING_INSTALL_PREFIX /opt/braid)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME braid)
  set(CPACK_DEBIAN_DEV_PACKAGE_NAME braid-dev)
  set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "braid (= ${PROJECT_VERSION})")
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
include(CPack)
