# Writes OUT = "#define DSATTN_GIT_COMMIT "<short hash>"" for the source
# tree SRC, touching the file only when the hash changed, so every build
# reports the commit it was built from (not the one CMake configured at).
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY "${SRC}"
                OUTPUT_VARIABLE C OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT C)
  set(C "unknown")
endif()
set(TXT "#define DSATTN_GIT_COMMIT \"${C}\"\n")
set(OLD "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" OLD)
endif()
if(NOT "${OLD}" STREQUAL "${TXT}")
  file(WRITE "${OUT}" "${TXT}")
endif()
