# Fails the build when a module carries its own copy of libstdc++ (cmake -DMODULE=... -DNM=...
# -P this file; run after linking torch_brickdev._C). A process has one libstdc++, PyTorch's
# shared one: a second, static copy inside brick's module (a toolchain or LDFLAGS adding
# -static-libstdc++) splits iostreams' locale state between the two, and the first integer
# written to a stream breaks (a segfault in std::ostream::_M_insert<long> on the GPU machine,
# error messages cut at their first number here).
if(NOT NM)
  message(STATUS "brick: no nm to check ${MODULE} for a copy of libstdc++")
  return()
endif()
execute_process(COMMAND "${NM}" -D --defined-only "${MODULE}" OUTPUT_VARIABLE symbols
                RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(STATUS "brick: nm could not read ${MODULE}; its libstdc++ was not checked")
  return()
endif()
# std::locale::classic() and std::ostream::_M_insert<long>: defined by libstdc++ itself only.
foreach(symbol _ZNSt6locale7classicEv _ZNSo9_M_insertIlEERSoT_)
  string(FIND "${symbols}" " ${symbol}\n" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR
      "brick: ${MODULE} defines ${symbol}: it carries its own copy of libstdc++, which breaks "
      "iostreams beside PyTorch's shared one. Link it without -static-libstdc++ (look at "
      "LDFLAGS, CMAKE_SHARED_LINKER_FLAGS, CMAKE_MODULE_LINKER_FLAGS and the compiler's specs).")
  endif()
endforeach()
