# Included by CMakeLists.txt: finds torch, decides where the CUDA runtime comes from, then runs
# find_package(Torch). Sets TORCH_OFFLOAD_TORCH_VERSION (torch.__version__ of the torch built
# against), TORCH_OFFLOAD_WITH_CUDA, and TORCH_OFFLOAD_CUDA_FROM (toolkit, pip or none).
#
# The library compiles no device code: its CUDA sources are C++ that call the CUDA runtime API
# (streams, events, asynchronous copies) through torch's c10/ATen CUDA headers. They need CUDA's
# headers and libcudart, not nvcc. torch's CMake config (Caffe2/public/cuda.cmake) would require a
# whole toolkit with nvcc, enable the CUDA language, pick nvcc architecture flags for code we do not
# have, and warn that CMAKE_CUDA_ARCHITECTURES (which enabling the language always defines) is
# ignored. Defining torch::cudart before find_package(Torch) makes that file return at its include
# guard; torch's targets then link the CUDA runtime chosen here, in this order:
#   1. a CUDA toolkit that CMake's FindCUDAToolkit finds (CUDAToolkit_ROOT, nvcc on PATH, CUDA_PATH,
#      /usr/local/cuda) with torch's CUDA major version (libcudart.so.<major> is what torch loads);
#   2. else NVIDIA's pip packages that a PyPI torch depends on, beside torch in site-packages
#      (nvidia/*/include, nvidia/*/lib/libcudart.so.<major>): the headers and runtime of torch's own
#      CUDA version, so no toolkit is needed;
#   3. else the CPU kernels only, with a one-line notice.
# -DTORCH_OFFLOAD_CUDA=OFF builds the CPU kernels only; ON fails where 1 and 2 find nothing.
set(TORCH_OFFLOAD_CUDA AUTO CACHE STRING
    "CUDA support: AUTO (a CUDA toolkit, else NVIDIA's pip packages beside torch, else CPU only), ON, OFF")
set_property(CACHE TORCH_OFFLOAD_CUDA PROPERTY STRINGS AUTO ON OFF)

# torch must be the exact one the library will be loaded into (torch::class_ is not stable ABI):
# Torch_DIR or CMAKE_PREFIX_PATH name it (scripts/build.sh passes torch.utils.cmake_prefix_path),
# else the torch of the Python that runs the build (pip install --no-build-isolation .).
find_file(TORCH_OFFLOAD_TORCH_CONFIG TorchConfig.cmake PATHS ${Torch_DIR} ${CMAKE_PREFIX_PATH}
          PATH_SUFFIXES Torch share/cmake/Torch NO_DEFAULT_PATH NO_CACHE)
if(NOT TORCH_OFFLOAD_TORCH_CONFIG)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  # Where torch is, without importing it (~2 s).
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
            "import importlib.util, os; s = importlib.util.find_spec('torch'); print(os.path.join(os.path.dirname(s.origin), 'share', 'cmake') if s else '')"
    OUTPUT_VARIABLE TORCH_OFFLOAD_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(TORCH_OFFLOAD_TORCH_PREFIX)
    list(APPEND CMAKE_PREFIX_PATH "${TORCH_OFFLOAD_TORCH_PREFIX}")
    find_file(TORCH_OFFLOAD_TORCH_CONFIG TorchConfig.cmake PATHS "${TORCH_OFFLOAD_TORCH_PREFIX}"
              PATH_SUFFIXES Torch NO_DEFAULT_PATH NO_CACHE)
  endif()
endif()
if(NOT TORCH_OFFLOAD_TORCH_CONFIG)
  message(FATAL_ERROR
    "torch_offload builds against an installed torch, and ${Python3_EXECUTABLE} has none. Install "
    "torch, then run `pip install --no-build-isolation .` (an isolated build does not see it), or "
    "pass -DCMAKE_PREFIX_PATH=<torch>/share/cmake.")
endif()
get_filename_component(TORCH_OFFLOAD_TORCH_ROOT "${TORCH_OFFLOAD_TORCH_CONFIG}/../../../.." ABSOLUTE)

# torch.__version__ and torch.version.cuda: torch/version.py of a Python install, else the
# build-version file of a libtorch archive, else TorchConfigVersion.cmake (no local tag).
set(TORCH_OFFLOAD_TORCH_VERSION "")
set(_torch_cuda_version "")
if(EXISTS "${TORCH_OFFLOAD_TORCH_ROOT}/version.py")
  file(STRINGS "${TORCH_OFFLOAD_TORCH_ROOT}/version.py" _line REGEX "^__version__ *=")
  string(REGEX REPLACE "^__version__ *= *['\"]([^'\"]*)['\"].*" "\\1" TORCH_OFFLOAD_TORCH_VERSION "${_line}")
  file(STRINGS "${TORCH_OFFLOAD_TORCH_ROOT}/version.py" _line REGEX "^cuda[^=]*= *['\"]")
  string(REGEX REPLACE "^cuda[^=]*= *['\"]([^'\"]*)['\"].*" "\\1" _torch_cuda_version "${_line}")
elseif(EXISTS "${TORCH_OFFLOAD_TORCH_ROOT}/build-version")
  file(STRINGS "${TORCH_OFFLOAD_TORCH_ROOT}/build-version" TORCH_OFFLOAD_TORCH_VERSION LIMIT_COUNT 1)
  if(TORCH_OFFLOAD_TORCH_VERSION MATCHES "\\+cu([0-9]+)([0-9])$")
    set(_torch_cuda_version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
  endif()
else()
  include("${TORCH_OFFLOAD_TORCH_CONFIG}/../TorchConfigVersion.cmake" OPTIONAL)
  set(TORCH_OFFLOAD_TORCH_VERSION "${PACKAGE_VERSION}")
endif()
string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${_torch_cuda_version}")
set(_torch_is_cuda_build OFF)
if(EXISTS "${TORCH_OFFLOAD_TORCH_ROOT}/lib/libtorch_cuda.so")
  set(_torch_is_cuda_build ON)
endif()

set(TORCH_OFFLOAD_CUDA_FROM none)
if(_torch_is_cuda_build AND NOT TORCH_OFFLOAD_CUDA STREQUAL "OFF")
  # 1. A CUDA toolkit of torch's major version.
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND (CUDAToolkit_VERSION_MAJOR STREQUAL _torch_cuda_major OR NOT _torch_cuda_major))
    add_library(torch_offload_cudart INTERFACE IMPORTED)
    target_link_libraries(torch_offload_cudart INTERFACE CUDA::cudart)
    set(TORCH_OFFLOAD_CUDA_FROM toolkit)
    message(STATUS "torch_offload: CUDA runtime of the CUDA toolkit ${CUDAToolkit_VERSION} (${CUDAToolkit_LIBRARY_DIR})")
  else()
    if(CUDAToolkit_FOUND)
      message(STATUS "torch_offload: not using the CUDA toolkit ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR}): "
                     "torch ${TORCH_OFFLOAD_TORCH_VERSION} was built with CUDA ${_torch_cuda_version}")
    endif()
    # 2. NVIDIA's pip packages beside torch (nvidia/cu13/{include,lib} for CUDA 13; one package
    #    per library, nvidia/cuda_runtime/... and nvidia/cublas/..., for CUDA 12).
    get_filename_component(_site "${TORCH_OFFLOAD_TORCH_ROOT}" DIRECTORY)
    file(GLOB _cudart "${_site}/nvidia/*/lib/libcudart.so.${_torch_cuda_major}")
    file(GLOB _runtime_header "${_site}/nvidia/*/include/cuda_runtime_api.h")
    if(_torch_cuda_major AND _cudart AND _runtime_header)
      list(GET _cudart 0 _cudart)
      file(GLOB _nvidia_includes LIST_DIRECTORIES true "${_site}/nvidia/*/include")
      add_library(torch_offload_cudart SHARED IMPORTED)
      set_target_properties(torch_offload_cudart PROPERTIES
        IMPORTED_LOCATION "${_cudart}" INTERFACE_INCLUDE_DIRECTORIES "${_nvidia_includes}")
      set(TORCH_OFFLOAD_CUDA_FROM pip)
      message(STATUS "torch_offload: CUDA runtime of NVIDIA's pip packages beside torch (${_cudart})")
    endif()
  endif()
  if(NOT TARGET torch_offload_cudart)
    set(_why "torch ${TORCH_OFFLOAD_TORCH_VERSION} uses CUDA ${_torch_cuda_version}, but no CUDA toolkit "
             "of that version (CUDAToolkit_ROOT) and no NVIDIA pip packages beside torch were found")
    if(TORCH_OFFLOAD_CUDA STREQUAL "ON")
      message(FATAL_ERROR "torch_offload: TORCH_OFFLOAD_CUDA=ON, but ${_why}")
    endif()
    message(NOTICE "torch_offload: ${_why}: building the CPU kernels only")
  endif()
  # torch's targets name torch::cudart; its cuda.cmake returns when the target exists.
  add_library(torch::cudart INTERFACE IMPORTED)
  if(TARGET torch_offload_cudart)
    target_link_libraries(torch::cudart INTERFACE torch_offload_cudart)
  endif()
elseif(_torch_is_cuda_build)
  message(STATUS "torch_offload: TORCH_OFFLOAD_CUDA=OFF: building the CPU kernels only")
  add_library(torch::cudart INTERFACE IMPORTED)
endif()
if(TARGET torch_offload_cudart)
  set(TORCH_OFFLOAD_WITH_CUDA ON)
else()
  set(TORCH_OFFLOAD_WITH_CUDA OFF)
endif()

# TorchConfig.cmake adds a separate libkineto to TORCH_LIBRARIES and warns when there is none;
# torch's wheels link kineto into libtorch_cpu. Name that file for it (TORCH_LIBRARIES is not
# linked here: the targets link the torch target).
if(NOT kineto_LIBRARY)
  find_library(kineto_LIBRARY kineto PATHS "${TORCH_OFFLOAD_TORCH_ROOT}/lib")
  if(NOT kineto_LIBRARY AND EXISTS "${TORCH_OFFLOAD_TORCH_ROOT}/lib/libtorch_cpu.so")
    set(kineto_LIBRARY "${TORCH_OFFLOAD_TORCH_ROOT}/lib/libtorch_cpu.so" CACHE FILEPATH
        "kineto (linked into libtorch_cpu in torch's wheels)" FORCE)
  endif()
endif()

find_package(Torch REQUIRED PATHS "${TORCH_OFFLOAD_TORCH_ROOT}/share/cmake/Torch" NO_DEFAULT_PATH)
message(STATUS "torch_offload: torch ${TORCH_OFFLOAD_TORCH_VERSION} (${TORCH_OFFLOAD_TORCH_ROOT}); "
               "CUDA support ${TORCH_OFFLOAD_WITH_CUDA} (${TORCH_OFFLOAD_CUDA_FROM})")
