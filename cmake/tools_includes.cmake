# tools_includes.cmake - the tools' include rule, checked before the CLI is
# built: a file in tools/ includes the public headers (include/dsattn*.h),
# the tools' own headers, the generated dsattn_commit.h, and only the
# internal headers named in ALLOWED (CMakeLists.txt DSATTN_TOOLS_INTERNAL).
# Usage: cmake -DSRC=<source dir> "-DALLOWED=a.h;b.h" -DOUT=<stamp> -P this
file(GLOB tool_files ${SRC}/tools/*.c ${SRC}/tools/*.h)
file(GLOB public RELATIVE ${SRC}/include ${SRC}/include/*.h)
file(GLOB own RELATIVE ${SRC}/tools ${SRC}/tools/*.h)
set(ok ${ALLOWED} ${public} ${own} dsattn_commit.h)
set(bad "")
foreach(f ${tool_files})
  file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(l ${lines})
    string(REGEX MATCH "\"([^\"]+)\"" _ "${l}")
    list(FIND ok "${CMAKE_MATCH_1}" at)
    if(at LESS 0)
      file(RELATIVE_PATH rel ${SRC} ${f})
      list(APPEND bad "${rel}: #include \"${CMAKE_MATCH_1}\"")
    endif()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " msg)
  message(FATAL_ERROR "tools include internal headers not on DSATTN_TOOLS_INTERNAL "
                      "(CMakeLists.txt):\n  ${msg}")
endif()
file(WRITE ${OUT} "ok\n")
