# Finds CUTLASS/CuTe headers (never vendored). In order: the cache variable
# FLASH_KDA_CUTLASS_INCLUDE_DIR, the environment variable CUTLASS_INCLUDE_DIR (for offline GPU
# machines), then the headers shipped inside the `nvidia-cutlass` Python package.
set(FLASH_KDA_CUTLASS_INCLUDE_DIR "$ENV{CUTLASS_INCLUDE_DIR}" CACHE PATH "Directory holding cute/ and cutlass/ headers")
if(NOT FLASH_KDA_CUTLASS_INCLUDE_DIR)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source', 'include') if s else '')"
      OUTPUT_VARIABLE _cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set(FLASH_KDA_CUTLASS_INCLUDE_DIR "${_cutlass_inc}" CACHE PATH "" FORCE)
  endif()
endif()
if(NOT EXISTS "${FLASH_KDA_CUTLASS_INCLUDE_DIR}/cute/tensor.hpp")
  message(FATAL_ERROR
    "CUTLASS headers not found (looked in '${FLASH_KDA_CUTLASS_INCLUDE_DIR}'). "
    "Run `pip install nvidia-cutlass`, or set CUTLASS_INCLUDE_DIR to a directory holding cute/ and cutlass/.")
endif()
message(STATUS "flash_kda: CUTLASS headers in ${FLASH_KDA_CUTLASS_INCLUDE_DIR}")
