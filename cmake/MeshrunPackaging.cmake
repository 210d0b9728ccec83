# Debian packages for site admins (CPack DEB, one package per component):
#   meshrun               the CLI, the trainer and tokenizer, templates, man page, bash completion
#   meshrun-slurm-plugin  spank_meshrun.so and its plugstack.conf.d snippet, pinned to the exact Slurm release
#                         it was built against (Slurm refuses plugins of another major.minor)
# Built by scripts/package (cpack -G DEB in the build directory); checked by tests/plugin/package_check.sh.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME meshrun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "meshrun")
set(CPACK_PACKAGE_CONTACT "meshrun maintainers <meshrun@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # dpkg-shlibdeps: libhwloc15, libtomlplusplus3, libstdc++6 ...

# The components: everything without a COMPONENT is "Unspecified" (the CLI side); the plugin's install rules
# say COMPONENT plugin.
set(CPACK_COMPONENTS_ALL Unspecified plugin)
set(CPACK_DEBIAN_UNSPECIFIED_PACKAGE_NAME meshrun)
set(CPACK_COMPONENT_UNSPECIFIED_DESCRIPTION
    "lays out 5D-parallel LLM training on Slurm clusters\n meshrun plan/topo/sbatch/run/exec, meshrun-train, job templates.")
set(CPACK_DEBIAN_PLUGIN_PACKAGE_NAME meshrun-slurm-plugin)
set(CPACK_COMPONENT_PLUGIN_DESCRIPTION
    "meshrun SPANK plugin for Slurm\n --mesh-* options for sbatch/srun/salloc and each task's environment; link the\n plugstack.conf.d snippet on login and compute nodes.")

# The exact Slurm release of the headers the plugin was built with (libslurm-dev's version), e.g.
# 22.05.8-4+deb12u3: the package installs only next to that release.
find_program(MESHRUN_DPKG_QUERY dpkg-query)
set(MESHRUN_SLURM_DEB_VERSION "" CACHE STRING "Debian version of the Slurm the plugin is built for (default: libslurm-dev's)")
if(NOT MESHRUN_SLURM_DEB_VERSION AND MESHRUN_DPKG_QUERY)
  execute_process(COMMAND ${MESHRUN_DPKG_QUERY} -W -f=\${Version} libslurm-dev
                  OUTPUT_VARIABLE MESHRUN_SLURM_DEB_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                  RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    set(MESHRUN_SLURM_DEB_VERSION "")
  endif()
endif()
if(MESHRUN_SLURM_DEB_VERSION)
  # srun/sbatch (slurm-client, login nodes) or slurmstepd (slurmd, compute nodes) load it: either, same release.
  set(CPACK_DEBIAN_PLUGIN_PACKAGE_DEPENDS
      "slurm-client (= ${MESHRUN_SLURM_DEB_VERSION}) | slurmd (= ${MESHRUN_SLURM_DEB_VERSION})")
else()
  message(STATUS "meshrun: Slurm's Debian version unknown (no libslurm-dev package); the plugin package would "
                 "not pin Slurm: set MESHRUN_SLURM_DEB_VERSION")
endif()
include(CPack)
