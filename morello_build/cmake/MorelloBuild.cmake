# CMake functions of morello-build: synthesize kernels at build time and compile them.
#
#   morello_add_kernel(<target> NAME <c-name> SPEC <spec-text> [TARGET_ISA <isa>...]
#                      [OUTPUT_DIR <dir>] [NO_VERIFY] [HEADER_DIR_VAR <var>])
#   morello_add_kernels(<target> CONFIG <pyproject.toml|morello.toml> [KERNELS <name>...]
#                       [TARGET_ISA <isa>...] [OUTPUT_DIR <dir>] [NO_VERIFY] [HEADER_DIR_VAR <var>])
#   morello_add_python_module(<module> CONFIG <toml> [KERNELS <name>...] [TARGET_ISA <isa>...]
#                             [OUTPUT_DIR <dir>] [NO_VERIFY] [STABLE_ABI <3.x>|NO_STABLE_ABI])
#
# <target> becomes a STATIC, position-independent library with one exported C function per
# kernel; its include directory holds <name>.h per kernel and morello_kernels.h.
#
# How builds stay incremental: the declarations are read at configure time (the toml is a
# configure dependency), which writes one small stamp per kernel holding its normalized
# declaration, its ISAs and the morello-build version + source fingerprint, rewritten only
# when it changes. Each kernel's generate rule depends on its stamp only, never on the
# synthesis cache, and the generator rewrites a source only when its text changed.
#
# Cache variables: MORELLO_PYTHON (interpreter running the generator), MORELLO_TARGET_ISA
# (default ISA list, "native" if empty), MORELLO_CACHE_DIR (defaults to $ENV{MORELLO_CACHE_DIR}),
# MORELLO_VERIFY (ON/OFF; empty = the config's `verify`), MORELLO_JOBS (size of the Ninja
# job pool bounding concurrent syntheses).

include_guard(GLOBAL)

if(CMAKE_VERSION VERSION_LESS 3.15)
  message(FATAL_ERROR "morello-build needs CMake 3.15 or newer (found ${CMAKE_VERSION})")
endif()

cmake_policy(PUSH)
cmake_policy(VERSION 3.15...3.31)

get_filename_component(_MORELLO_PKG_DIR "${CMAKE_CURRENT_LIST_DIR}/.." REALPATH)
file(STRINGS "${_MORELLO_PKG_DIR}/__init__.py" _morello_v REGEX "^__version__ *= *")
string(REGEX REPLACE "^__version__ *= *[\"']([^\"']*)[\"'].*" "\\1" MorelloBuild_VERSION "${_morello_v}")
unset(_morello_v)

set(MORELLO_TARGET_ISA "" CACHE STRING
    "ISAs for morello kernels without TARGET_ISA (native, amx, avx512, avx2, x86-64; a list builds all with runtime dispatch). Empty: the declarations decide.")
if(NOT DEFINED MORELLO_CACHE_DIR)
  set(MORELLO_CACHE_DIR "$ENV{MORELLO_CACHE_DIR}" CACHE PATH
      "Synthesis cache of morello-build (empty: its default user cache directory)")
endif()
set(MORELLO_VERIFY "" CACHE STRING
    "Verify kernels against numpy at build time when the host can run them (ON/OFF; empty: the config decides)")
if(NOT DEFINED MORELLO_JOBS)
  cmake_host_system_information(RESULT _morello_cores QUERY NUMBER_OF_PHYSICAL_CORES)
  if(NOT _morello_cores OR _morello_cores LESS 1)
    set(_morello_cores 1)
  elseif(_morello_cores GREATER 4)
    set(_morello_cores 4)
  endif()
  set(MORELLO_JOBS "${_morello_cores}" CACHE STRING
      "Maximum number of concurrent kernel syntheses (Ninja job pool 'morello')")
  unset(_morello_cores)
endif()

# --- the interpreter that runs the generator -------------------------------------------
# Prefer an interpreter whose morello_build is the package this file belongs to, so the
# generator and the CMake functions always come from the same release.
function(_morello_find_python)
  set(_cands "")
  if(MORELLO_PYTHON)
    list(APPEND _cands "${MORELLO_PYTHON}")
  else()
    foreach(_v Python_EXECUTABLE Python3_EXECUTABLE PYTHON_EXECUTABLE)
      if(${_v})
        list(APPEND _cands "${${_v}}")
      endif()
    endforeach()
    find_program(_MORELLO_PY_ON_PATH NAMES python3 python)
    if(_MORELLO_PY_ON_PATH)
      list(APPEND _cands "${_MORELLO_PY_ON_PATH}")
    endif()
  endif()
  set(_chosen "")
  set(_other "")
  set(_other_dir "")
  foreach(_py IN LISTS _cands)
    execute_process(
      COMMAND "${_py}" -c "import os, morello_build; print(os.path.realpath(os.path.dirname(morello_build.__file__)))"
      RESULT_VARIABLE _rc OUTPUT_VARIABLE _dir ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 0)
      if(_dir STREQUAL _MORELLO_PKG_DIR)
        set(_chosen "${_py}")
        break()
      elseif(NOT _other)
        set(_other "${_py}")
        set(_other_dir "${_dir}")
      endif()
    endif()
  endforeach()
  if(NOT _chosen AND _other)
    message(WARNING "morello-build: ${_other} imports morello_build from ${_other_dir}, not from "
                    "${_MORELLO_PKG_DIR} (this CMake package); using it anyway. Set MORELLO_PYTHON to choose.")
    set(_chosen "${_other}")
  endif()
  if(_chosen)
    set_property(GLOBAL PROPERTY MORELLO_PYTHON "${_chosen}")
  elseif(MORELLO_PYTHON)
    set_property(GLOBAL PROPERTY MORELLO_PYTHON_ERROR
                 "MORELLO_PYTHON=${MORELLO_PYTHON} cannot import morello_build")
  else()
    set_property(GLOBAL PROPERTY MORELLO_PYTHON_ERROR
                 "no Python interpreter that can import morello_build was found (tried: ${_cands}); set MORELLO_PYTHON or Python_EXECUTABLE")
  endif()
endfunction()
_morello_find_python()

# --- shared implementation --------------------------------------------------------------

function(_morello_python out)
  get_property(_py GLOBAL PROPERTY MORELLO_PYTHON)
  if(NOT _py)
    get_property(_err GLOBAL PROPERTY MORELLO_PYTHON_ERROR)
    message(FATAL_ERROR "morello-build: ${_err}")
  endif()
  set(${out} "${_py}" PARENT_SCOPE)
endfunction()

function(_morello_job_pool)
  get_property(_pools GLOBAL PROPERTY JOB_POOLS)
  if(NOT _pools MATCHES "(^|;)morello=")
    set_property(GLOBAL APPEND PROPERTY JOB_POOLS "morello=${MORELLO_JOBS}")
  endif()
endfunction()

# _morello_library(<target> <fn> <source-args> <select-args> <isas> <module> <options>...)
# Runs the configure step, then declares one generate rule per kernel and the library.
function(_morello_library target fn source_args select_args isas module)
  cmake_parse_arguments(PARSE_ARGV 6 ARG "NO_VERIFY" "OUTPUT_DIR;HEADER_DIR_VAR" "")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${fn}: unexpected arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(TARGET ${target})
    message(FATAL_ERROR "${fn}: target ${target} already exists")
  endif()
  get_property(_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "C" IN_LIST _langs)
    message(FATAL_ERROR "${fn}: the C language is not enabled; add C to project(... LANGUAGES C ...)")
  endif()
  _morello_python(_py)
  _morello_job_pool()

  set(_out "${CMAKE_CURRENT_BINARY_DIR}/morello/${target}")
  if(ARG_OUTPUT_DIR)
    get_filename_component(_out "${ARG_OUTPUT_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  file(MAKE_DIRECTORY "${_out}" "${_out}/.stamp")

  set(_target_args "")
  if(isas)
    string(REPLACE ";" "," _isa_csv "${isas}")
    set(_target_args --target "${_isa_csv}")
  endif()
  set(_module_args "")
  if(module)
    set(_module_args --python-module "${module}")
  endif()

  # Configure step: learn the outputs, write per-kernel declaration stamps.
  set(_info "${_out}/morello_info.cmake")
  execute_process(
    COMMAND "${_py}" -m morello_build.build generate ${source_args} ${select_args} ${_target_args}
            --out-dir "${_out}" --cmake-info "${_info}" ${_module_args}
    RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_VARIABLE _stdout
    ERROR_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${fn}(${target}): ${_err}")
  endif()
  include("${_info}")
  # Upgrading or editing morello-build must re-run this step (new fingerprint, new stamps).
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_MORELLO_PACKAGE_SOURCES})

  set(_verify_args "")
  if(ARG_NO_VERIFY)
    set(_verify_args --no-verify)
  elseif(NOT MORELLO_VERIFY STREQUAL "")
    if(MORELLO_VERIFY)
      set(_verify_args --verify)
    else()
      set(_verify_args --no-verify)
    endif()
  endif()
  set(_env "")
  if(MORELLO_CACHE_DIR)
    set(_env "${CMAKE_COMMAND}" -E env "MORELLO_CACHE_DIR=${MORELLO_CACHE_DIR}" --)
  endif()

  set(_sources "")
  set(_stamps "")
  foreach(_k IN LISTS _MORELLO_KERNELS)
    set(_byproducts "${_out}/${_k}.json")
    set(_k_sources "")
    list(LENGTH _MORELLO_${_k}_SOURCES _n)
    math(EXPR _last "${_n} - 1")
    foreach(_i RANGE ${_last})
      list(GET _MORELLO_${_k}_SOURCES ${_i} _s)
      list(GET _MORELLO_${_k}_SOURCE_ISAS ${_i} _isa)
      list(APPEND _k_sources "${_out}/${_s}")
      if(NOT _isa STREQUAL "none")
        set_source_files_properties("${_out}/${_s}" PROPERTIES
          GENERATED TRUE COMPILE_OPTIONS "${_MORELLO_ISA_FLAGS_${_isa}}")
      else()
        set_source_files_properties("${_out}/${_s}" PROPERTIES GENERATED TRUE)
      endif()
    endforeach()
    foreach(_h IN LISTS _MORELLO_${_k}_HEADERS)
      list(APPEND _byproducts "${_out}/${_h}")
    endforeach()
    string(REPLACE ";" "," _k_isas "${_MORELLO_${_k}_ISAS}")
    set(_kernel_args "")
    if(module OR source_args MATCHES "^--config")
      set(_kernel_args --kernel "${_k}")
    endif()
    set(_stamp "${_out}/.stamp/${_k}.stamp")
    add_custom_command(
      OUTPUT "${_stamp}"
      BYPRODUCTS ${_k_sources} ${_byproducts}
      COMMAND ${_env} "${_py}" -m morello_build.build generate ${source_args} ${_kernel_args}
              --target "${_k_isas}" --out-dir "${_out}" ${_verify_args}
      COMMAND "${CMAKE_COMMAND}" -E touch "${_stamp}"
      DEPENDS "${_MORELLO_${_k}_STAMP}" ${_MORELLO_${_k}_DEPENDS}
      JOB_POOL morello
      COMMENT "morello: kernel ${_k} (${_MORELLO_${_k}_ISAS})"
      VERBATIM)
    list(APPEND _sources ${_k_sources})
    list(APPEND _stamps "${_stamp}")
  endforeach()

  add_library(${target} STATIC ${_sources} ${_stamps})
  set_target_properties(${target} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    C_STANDARD 99
    C_STANDARD_REQUIRED ON
    C_EXTENSIONS ON
    MORELLO_KERNELS "${_MORELLO_KERNELS}"
    MORELLO_OUTPUT_DIR "${_out}")
  if(_MORELLO_MODULE_SOURCE)
    set_target_properties(${target} PROPERTIES MORELLO_MODULE_SOURCE "${_MORELLO_MODULE_SOURCE}")
  endif()
  # Kernels are scheduled by hand or by the synthesizer: always optimize them, whatever the
  # build type, and never let a binding library's -Os reach them.
  target_compile_options(${target} PRIVATE $<$<C_COMPILER_ID:GNU,Clang,AppleClang,IntelLLVM>:-O3>)
  target_include_directories(${target} PUBLIC "$<BUILD_INTERFACE:${_out}>")
  if(ARG_HEADER_DIR_VAR)
    set(${ARG_HEADER_DIR_VAR} "${_out}" PARENT_SCOPE)
  endif()
endfunction()

# Re-pass the caller's parsed options (ARG_<opt>) that are set, as `<opt> [values...]`, to
# another morello function: a flag (NO_*) alone, any other option with its value(s).
macro(_morello_forward out)
  set(${out} "")
  foreach(_opt ${ARGN})
    if(ARG_${_opt})
      if(_opt MATCHES "^NO_")
        list(APPEND ${out} ${_opt})
      else()
        list(APPEND ${out} ${_opt} ${ARG_${_opt}})
      endif()
    endif()
  endforeach()
endmacro()

# --- public functions -------------------------------------------------------------------

function(morello_add_kernel target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_VERIFY" "NAME;SPEC;OUTPUT_DIR;HEADER_DIR_VAR" "TARGET_ISA")
  if(NOT ARG_NAME OR NOT ARG_SPEC)
    message(FATAL_ERROR "morello_add_kernel(${target}): NAME <c-name> and SPEC <spec-text> are required")
  endif()
  set(_isas "${ARG_TARGET_ISA}")
  if(NOT _isas)
    set(_isas "${MORELLO_TARGET_ISA}")
  endif()
  if(NOT _isas)
    set(_isas native)
  endif()
  _morello_forward(_pass NO_VERIFY OUTPUT_DIR HEADER_DIR_VAR)
  _morello_library(${target} morello_add_kernel "--spec;${ARG_SPEC};--name;${ARG_NAME}" "" "${_isas}" "" ${_pass})
  if(ARG_HEADER_DIR_VAR)
    set(${ARG_HEADER_DIR_VAR} "${${ARG_HEADER_DIR_VAR}}" PARENT_SCOPE)
  endif()
endfunction()

function(morello_add_kernels target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_VERIFY" "CONFIG;OUTPUT_DIR;HEADER_DIR_VAR;_PYTHON_MODULE" "KERNELS;TARGET_ISA")
  if(NOT ARG_CONFIG)
    message(FATAL_ERROR "morello_add_kernels(${target}): CONFIG <pyproject.toml|morello.toml> is required")
  endif()
  get_filename_component(_cfg "${ARG_CONFIG}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_cfg}")
  set(_isas "${ARG_TARGET_ISA}")
  if(NOT _isas)
    set(_isas "${MORELLO_TARGET_ISA}")
  endif()
  set(_select "")
  foreach(_k IN LISTS ARG_KERNELS)
    list(APPEND _select --kernel "${_k}")
  endforeach()
  _morello_forward(_pass NO_VERIFY OUTPUT_DIR HEADER_DIR_VAR)
  _morello_library(${target} morello_add_kernels "--config;${_cfg}" "${_select}" "${_isas}"
                   "${ARG__PYTHON_MODULE}" ${_pass})
  if(ARG_HEADER_DIR_VAR)
    set(${ARG_HEADER_DIR_VAR} "${${ARG_HEADER_DIR_VAR}}" PARENT_SCOPE)
  endif()
endfunction()

function(morello_add_python_module name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_VERIFY;NO_STABLE_ABI" "CONFIG;OUTPUT_DIR;STABLE_ABI" "KERNELS;TARGET_ISA")
  if(NOT ARG_CONFIG)
    message(FATAL_ERROR "morello_add_python_module(${name}): CONFIG <pyproject.toml|morello.toml> is required")
  endif()
  _morello_forward(_pass NO_VERIFY OUTPUT_DIR KERNELS TARGET_ISA)
  set(_lib ${name}_morello_kernels)
  morello_add_kernels(${_lib} CONFIG "${ARG_CONFIG}" _PYTHON_MODULE ${name} ${_pass})
  get_target_property(_src ${_lib} MORELLO_MODULE_SOURCE)

  # The stable ABI: requested by scikit-build-core (wheel.py-api = "cp3x") or by STABLE_ABI.
  set(_sabi "")
  if(NOT ARG_NO_STABLE_ABI)
    if(ARG_STABLE_ABI)
      set(_sabi "${ARG_STABLE_ABI}")
    elseif(SKBUILD_SABI_VERSION)
      set(_sabi "${SKBUILD_SABI_VERSION}")
    endif()
    if(_sabi AND _sabi VERSION_LESS 3.11)
      message(FATAL_ERROR "morello_add_python_module(${name}): the buffer protocol is in the stable ABI from 3.11 (got STABLE_ABI ${_sabi})")
    endif()
  endif()
  if(_sabi AND CMAKE_VERSION VERSION_LESS 3.26 AND NOT SKBUILD)
    # scikit-build-core ships a newer FindPython; plain CMake < 3.26 has no SABIModule.
    message(WARNING "morello_add_python_module(${name}): the stable ABI needs CMake 3.26 "
                    "(FindPython Development.SABIModule); building a version-specific module")
    set(_sabi "")
  endif()
  set(_components Interpreter Development.Module)
  if(_sabi)
    list(APPEND _components Development.SABIModule)
  endif()
  if(NOT COMMAND Python_add_library OR (_sabi AND NOT TARGET Python::SABIModule))
    if(NOT Python_EXECUTABLE)
      _morello_python(_py)
      set(Python_EXECUTABLE "${_py}")
    endif()
    find_package(Python 3.10 COMPONENTS ${_components} REQUIRED)
  endif()
  if(_sabi AND TARGET Python::SABIModule)
    Python_add_library(${name} MODULE WITH_SOABI USE_SABI ${_sabi} "${_src}")
  else()
    if(_sabi)
      message(WARNING "morello_add_python_module(${name}): Python::SABIModule unavailable; building a version-specific module")
    endif()
    Python_add_library(${name} MODULE WITH_SOABI "${_src}")
  endif()
  set_target_properties(${name} PROPERTIES C_STANDARD 99 C_EXTENSIONS ON)
  target_link_libraries(${name} PRIVATE ${_lib})
endfunction()

cmake_policy(POP)
