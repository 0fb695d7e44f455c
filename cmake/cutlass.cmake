# Finds CUTLASS/CuTe headers (never vendored) and sets FLASH_KDA_CUTLASS_INCLUDE. Looked up on
# every configure, in order:
#   1. the cache variable FLASH_KDA_CUTLASS_INCLUDE_DIR (-D...);
#   2. the environment variable CUTLASS_INCLUDE_DIR (offline GPU machines);
#   3. the headers of an installed `nvidia-cutlass` Python package (pip install . puts one in
#      its isolated build environment);
#   4. the `nvidia-cutlass` wheel from the package index, fetched with `pip download --no-deps`
#      and only its include/ tree unpacked into <build>/_deps/cutlass/ (nothing installed, so
#      pip's view of the environment stays consistent); reused by later configures.
# Nothing found is not cached, so fixing the environment and re-running cmake in the same
# build directory works.
set(FLASH_KDA_CUTLASS_INCLUDE_DIR "" CACHE PATH "Directory holding cute/ and cutlass/ headers (optional)")
set(FLASH_KDA_CUTLASS_PACKAGE "nvidia-cutlass==4.2.0.0" CACHE STRING
    "pip requirement whose wheel supplies the CUTLASS headers when none are found otherwise")
set(_fkda_tried "")
set(FLASH_KDA_CUTLASS_INCLUDE "")
set(_fkda_fetched "${CMAKE_BINARY_DIR}/_deps/cutlass/include")
foreach(_candidate IN ITEMS "${FLASH_KDA_CUTLASS_INCLUDE_DIR}" "$ENV{CUTLASS_INCLUDE_DIR}" "python" "fetch")
  if(_candidate STREQUAL "python" OR _candidate STREQUAL "fetch")
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(NOT Python3_Interpreter_FOUND)
      list(APPEND _fkda_tried "${_candidate}: no python3 found")
      continue()
    endif()
  endif()
  if(_candidate STREQUAL "python")
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source', 'include') if s else '')"
      OUTPUT_VARIABLE _candidate OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT _candidate)
      list(APPEND _fkda_tried "nvidia-cutlass package: not installed for ${Python3_EXECUTABLE}")
      continue()
    endif()
  elseif(_candidate STREQUAL "fetch")
    if(NOT EXISTS "${_fkda_fetched}/cute/tensor.hpp")
      message(STATUS "flash_kda: fetching CUTLASS headers (pip download --no-deps ${FLASH_KDA_CUTLASS_PACKAGE})")
      execute_process(
        COMMAND ${Python3_EXECUTABLE} "${CMAKE_CURRENT_LIST_DIR}/fetch_cutlass.py" "${FLASH_KDA_CUTLASS_PACKAGE}"
                "${CMAKE_BINARY_DIR}/_deps/cutlass"
        RESULT_VARIABLE _fkda_rc OUTPUT_VARIABLE _fkda_out ERROR_VARIABLE _fkda_out)
      if(NOT _fkda_rc EQUAL 0)
        string(STRIP "${_fkda_out}" _fkda_out)
        list(APPEND _fkda_tried "pip download ${FLASH_KDA_CUTLASS_PACKAGE}: ${_fkda_out}")
        continue()
      endif()
    endif()
    set(_candidate "${_fkda_fetched}")
  endif()
  if(NOT _candidate)
    continue()
  endif()
  if(EXISTS "${_candidate}/cute/tensor.hpp")
    set(FLASH_KDA_CUTLASS_INCLUDE "${_candidate}")
    break()
  endif()
  # A directory the user named explicitly must be right: never fall back silently.
  message(FATAL_ERROR "CUTLASS headers: '${_candidate}' (from -DFLASH_KDA_CUTLASS_INCLUDE_DIR, "
                      "CUTLASS_INCLUDE_DIR or the nvidia-cutlass package) holds no cute/tensor.hpp; point it at "
                      "CUTLASS's include/ directory.")
endforeach()
if(NOT FLASH_KDA_CUTLASS_INCLUDE)
  list(JOIN _fkda_tried "; " _fkda_tried)
  message(FATAL_ERROR
    "CUTLASS headers not found (tried: ${_fkda_tried}). Set CUTLASS_INCLUDE_DIR (or "
    "-DFLASH_KDA_CUTLASS_INCLUDE_DIR) to a directory holding cute/ and cutlass/, allow access to the "
    "package index, or configure with -DFLASH_KDA_CUDA=OFF for a CPU-only (reference) build.")
endif()
message(STATUS "flash_kda: CUTLASS headers in ${FLASH_KDA_CUTLASS_INCLUDE}")
