# Finds CUTLASS/CuTe headers (never vendored) and sets FLASH_KDA_CUTLASS_INCLUDE. Looked up on
# every configure, in order: the cache variable FLASH_KDA_CUTLASS_INCLUDE_DIR (-D...), the
# environment variable CUTLASS_INCLUDE_DIR (offline GPU machines), then the headers shipped in
# the `nvidia-cutlass` Python package. Nothing found is not cached, so fixing the environment
# and re-running cmake in the same build directory works.
set(FLASH_KDA_CUTLASS_INCLUDE_DIR "" CACHE PATH "Directory holding cute/ and cutlass/ headers (optional)")
set(_fkda_tried "")
set(FLASH_KDA_CUTLASS_INCLUDE "")
foreach(_candidate IN ITEMS "${FLASH_KDA_CUTLASS_INCLUDE_DIR}" "$ENV{CUTLASS_INCLUDE_DIR}" "python")
  if(_candidate STREQUAL "python")
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(NOT Python3_Interpreter_FOUND)
      continue()
    endif()
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source', 'include') if s else '')"
      OUTPUT_VARIABLE _candidate OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT _candidate)
      list(APPEND _fkda_tried "nvidia-cutlass package: not installed for ${Python3_EXECUTABLE}")
      continue()
    endif()
  endif()
  if(NOT _candidate)
    continue()
  endif()
  if(EXISTS "${_candidate}/cute/tensor.hpp")
    set(FLASH_KDA_CUTLASS_INCLUDE "${_candidate}")
    break()
  endif()
  # A directory the user named explicitly must be right: never fall back silently.
  message(FATAL_ERROR "CUTLASS headers: '${_candidate}' (from -DFLASH_KDA_CUTLASS_INCLUDE_DIR or "
                      "CUTLASS_INCLUDE_DIR) holds no cute/tensor.hpp; point it at CUTLASS's include/ directory.")
endforeach()
if(NOT FLASH_KDA_CUTLASS_INCLUDE)
  list(JOIN _fkda_tried "; " _fkda_tried)
  message(FATAL_ERROR
    "CUTLASS headers not found (tried: ${_fkda_tried}). Run `pip install --no-deps nvidia-cutlass` "
    "(headers only), set CUTLASS_INCLUDE_DIR to a directory holding cute/ and cutlass/, or "
    "configure with -DFLASH_KDA_CUDA=OFF for a CPU-only (reference) build.")
endif()
message(STATUS "flash_kda: CUTLASS headers in ${FLASH_KDA_CUTLASS_INCLUDE}")
