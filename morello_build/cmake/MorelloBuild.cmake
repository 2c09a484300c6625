# CMake functions of morello-build: synthesize kernels at build time and compile them.
#
#   morello_add_kernel(<target> NAME <c-name> SPEC <spec-text> [TARGET_ISA <isa>...]
#                      [TUNE <tune>] [OUTPUT_DIR <dir>] [NO_VERIFY] [HEADER_DIR_VAR <var>])
#   morello_add_kernel(<target> NAME <c-name> EXPR <expression> INPUTS <name>=<shape>,...
#                      [DTYPE f32|bf16] [THREADS <n>] [TARGET_ISA <isa>...] [TUNE <tune>]
#                      [OUTPUT_DIR <dir>] [NO_VERIFY] [HEADER_DIR_VAR <var>])
#   morello_add_kernels(<target> CONFIG <pyproject.toml|morello.toml> [KERNELS <name>...]
#                       [TARGET_ISA <isa>...] [TUNE <tune>] [OUTPUT_DIR <dir>] [NO_VERIFY]
#                       [HEADER_DIR_VAR <var>])
#   morello_add_python_module(<module> CONFIG <toml> [KERNELS <name>...] [TARGET_ISA <isa>...]
#                             [TUNE <tune>] [OUTPUT_DIR <dir>] [NO_VERIFY]
#                             [STABLE_ABI <3.x>|NO_STABLE_ABI])
#
# <target> becomes a STATIC, position-independent library with one exported C function per
# kernel; its include directory holds <name>.h per kernel and morello_kernels.h.
#
# SPEC is what `morello synth` takes: the text form, or the shorthand
# "matmul MxKxN [--dtype bf16] [--layout-b col] [--accumulate]"; it is checked at configure
# time. EXPR is a pipeline as a declaration's `expr` (e.g. "gelu(x @ w + b)"), INPUTS the
# shapes of its inputs as `morello synth --inputs` takes them (x=64x768,w=768x3072,b=3072),
# DTYPE the type of its matrix inputs; all are checked at configure time too.
# The build step builds exactly what configure resolved (ISAs and tuning included), so
# a CMake-built kernel is byte-identical to `morello synth --format c` on the same host.
#
# How builds stay incremental: the declarations are read at configure time (the toml is a
# configure dependency), which writes one small stamp per kernel holding its normalized
# declaration, its ISAs and tuning and the morello-build version + source fingerprint,
# rewritten only when it changes. The build step of a library depends on its kernels'
# stamps only, never on the synthesis cache, produces only the kernels whose stamp changed,
# and rewrites a source only when its text changed.
#
# Cache variables: MORELLO_PYTHON (interpreter running the generator), MORELLO_TARGET_ISA
# (default ISA list, "native" if empty), MORELLO_TUNE (default tuning; empty: the
# declarations decide), MORELLO_CACHE_DIR (defaults to $ENV{MORELLO_CACHE_DIR}),
# MORELLO_REMOTE_CACHE and MORELLO_REMOTE_CACHE_MODE (the shared cache tier; default to the
# environment variables of the same names),
# MORELLO_VERIFY (ON/OFF; empty = the config's `verify`), MORELLO_JOBS (kernels a build step
# synthesizes at once, one process each).

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
if(NOT DEFINED MORELLO_REMOTE_CACHE)
  set(MORELLO_REMOTE_CACHE "$ENV{MORELLO_REMOTE_CACHE}" CACHE STRING
      "Shared synthesis cache behind the local one: an fsspec URL (s3://bucket/prefix, file:///dir, https://... read-only) or off. Empty: the declarations' remote_cache, if any.")
endif()
if(NOT DEFINED MORELLO_REMOTE_CACHE_MODE)
  set(MORELLO_REMOTE_CACHE_MODE "$ENV{MORELLO_REMOTE_CACHE_MODE}" CACHE STRING
      "read-write or read-only (empty: the declarations' remote_cache_mode, else read-write)")
endif()
set(MORELLO_TUNE "" CACHE STRING
    "Tuning for morello kernels without TUNE (native, generic, zen3, zen4, zen5). Empty: the declarations decide (native with target native).")
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
      "Maximum number of kernels a morello build step synthesizes at once (one process each)")
  unset(_morello_cores)
endif()

# --- the interpreter that runs the generator -------------------------------------------
# Prefer an interpreter whose morello_build is the package this file belongs to, so the
# generator and the CMake functions always come from the same release. Every probe runs in
# the build tree, as the build step does: a package importable only from the directory
# cmake was started in (e.g. the root of a morello-build checkout) is not importable there.
# When no candidate imports this package as installed, the probe retries each with this
# package's parent directory on PYTHONPATH, and the build step then runs with it too.
set(_MORELLO_PROBE [=[
import os, sys
import morello_build
print(os.path.realpath(os.path.dirname(morello_build.__file__)))
try:
    import numpy, platformdirs, filelock
    if sys.version_info < (3, 11):
        import tomli
except ImportError as exc:
    print(exc)
]=])

# _morello_probe(<python> <pythonpath> <out-dir-var> <out-missing-var>): the package
# directory <python> imports (empty if none) and a missing dependency (empty if none).
function(_morello_probe py pythonpath out_dir out_missing)
  set(_env "")
  if(pythonpath)
    set(_env "${CMAKE_COMMAND}" -E env "PYTHONPATH=${pythonpath}" --)
  endif()
  execute_process(
    COMMAND ${_env} "${py}" -c "${_MORELLO_PROBE}"
    WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(_dir "")
  set(_missing "")
  if(_rc EQUAL 0 AND _out)
    string(REPLACE "\n" ";" _lines "${_out}")
    list(GET _lines 0 _dir)
    list(LENGTH _lines _n)
    if(_n GREATER 1)
      list(GET _lines 1 _missing)
    endif()
  endif()
  set(${out_dir} "${_dir}" PARENT_SCOPE)
  set(${out_missing} "${_missing}" PARENT_SCOPE)
endfunction()

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
  list(REMOVE_DUPLICATES _cands)
  get_filename_component(_parent "${_MORELLO_PKG_DIR}" DIRECTORY)
  set(_with_parent "${_parent}")
  if(NOT "$ENV{PYTHONPATH}" STREQUAL "")
    set(_with_parent "${_parent}:$ENV{PYTHONPATH}")
  endif()
  set(_chosen "")
  set(_pythonpath "")
  set(_other "")
  set(_other_dir "")
  set(_broken "")
  # 1. as installed; 2. this package through PYTHONPATH; 3. another morello_build.
  foreach(_pass installed pythonpath)
    foreach(_py IN LISTS _cands)
      if(_pass STREQUAL "installed")
        _morello_probe("${_py}" "" _dir _missing)
      else()
        _morello_probe("${_py}" "${_with_parent}" _dir _missing)
      endif()
      if(NOT _dir)
        continue()
      elseif(_missing)
        if(NOT _broken)
          set(_broken "${_py} imports morello_build from ${_dir} but not its dependencies (${_missing})")
        endif()
      elseif(_dir STREQUAL _MORELLO_PKG_DIR)
        set(_chosen "${_py}")
        if(_pass STREQUAL "pythonpath")
          set(_pythonpath "${_with_parent}")
        endif()
        break()
      elseif(NOT _other)
        set(_other "${_py}")
        set(_other_dir "${_dir}")
      endif()
    endforeach()
    if(_chosen)
      break()
    endif()
  endforeach()
  if(NOT _chosen AND _other)
    message(WARNING "morello-build: ${_other} imports morello_build from ${_other_dir}, not from "
                    "${_MORELLO_PKG_DIR} (this CMake package); using it anyway. Set MORELLO_PYTHON to choose.")
    set(_chosen "${_other}")
  endif()
  if(_chosen)
    set_property(GLOBAL PROPERTY MORELLO_PYTHON "${_chosen}")
    set_property(GLOBAL PROPERTY MORELLO_PYTHONPATH "${_pythonpath}")
  elseif(_broken)
    set_property(GLOBAL PROPERTY MORELLO_PYTHON_ERROR
                 "${_broken}: install morello-build into that interpreter (pip install morello-build, or the wheel of this checkout), or set MORELLO_PYTHON")
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

# _morello_generator_env(<var>): `cmake -E env ... --` running the generator with the cache
# directory and, when the package is found through it, the PYTHONPATH chosen above.
function(_morello_generator_env out)
  get_property(_pythonpath GLOBAL PROPERTY MORELLO_PYTHONPATH)
  set(_vars "")
  if(MORELLO_CACHE_DIR)
    list(APPEND _vars "MORELLO_CACHE_DIR=${MORELLO_CACHE_DIR}")
  endif()
  if(MORELLO_REMOTE_CACHE)
    list(APPEND _vars "MORELLO_REMOTE_CACHE=${MORELLO_REMOTE_CACHE}")
  endif()
  if(MORELLO_REMOTE_CACHE_MODE)
    list(APPEND _vars "MORELLO_REMOTE_CACHE_MODE=${MORELLO_REMOTE_CACHE_MODE}")
  endif()
  if(_pythonpath)
    list(APPEND _vars "PYTHONPATH=${_pythonpath}")
  endif()
  set(_env "")
  if(_vars)
    set(_env "${CMAKE_COMMAND}" -E env ${_vars} --)
  endif()
  set(${out} "${_env}" PARENT_SCOPE)
endfunction()

# _morello_library(<target> <fn> <source-args> <select-args> <isas> <tune> <module> <options>...)
# Runs the configure step, then declares the build step and the library.
function(_morello_library target fn source_args select_args isas tune module)
  cmake_parse_arguments(PARSE_ARGV 7 ARG "NO_VERIFY" "OUTPUT_DIR;HEADER_DIR_VAR" "")
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
  _morello_generator_env(_env)

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
  if(NOT tune)
    set(tune "${MORELLO_TUNE}")
  endif()
  if(tune)
    list(APPEND _target_args --tune "${tune}")
  endif()
  set(_module_args "")
  if(module)
    set(_module_args --python-module "${module}")
  endif()

  # Configure step: validate the declarations, learn the outputs, write per-kernel
  # declaration stamps (resolved ISAs and tuning included: the build step reads them).
  set(_info "${_out}/morello_info.cmake")
  execute_process(
    COMMAND ${_env} "${_py}" -m morello_build.integration generate ${source_args} ${select_args}
            ${_target_args} --out-dir "${_out}" --cmake-info "${_info}" ${_module_args}
    WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}"
    RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_VARIABLE _stdout
    ERROR_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    string(REGEX REPLACE "^error: " "" _err "${_err}")
    message(FATAL_ERROR "${fn}(${target}): ${_err}")
  endif()
  include("${_info}")
  # Upgrading or editing morello-build must re-run this step (new fingerprint, new stamps).
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_MORELLO_PACKAGE_SOURCES})

  set(_run_args "")
  if(ARG_NO_VERIFY)
    list(APPEND _run_args --no-verify)
  elseif(NOT MORELLO_VERIFY STREQUAL "")
    if(MORELLO_VERIFY)
      list(APPEND _run_args --verify)
    else()
      list(APPEND _run_args --no-verify)
    endif()
  endif()
  # Verification compiles the kernels with the compiler that builds them.
  if(CMAKE_C_COMPILER AND CMAKE_C_COMPILER_ID MATCHES "^(GNU|Clang|AppleClang|IntelLLVM)$")
    list(APPEND _run_args --cc "${CMAKE_C_COMPILER}")
  endif()
  if(MORELLO_JOBS GREATER 1)
    list(APPEND _run_args --jobs "${MORELLO_JOBS}")
  endif()

  set(_sources "")
  set(_stamps "")
  set(_decls "")
  set(_byproducts "")
  set(_kernel_args "")
  foreach(_k IN LISTS _MORELLO_KERNELS)
    list(APPEND _byproducts "${_out}/${_k}.json")
    list(LENGTH _MORELLO_${_k}_SOURCES _n)
    math(EXPR _last "${_n} - 1")
    foreach(_i RANGE ${_last})
      list(GET _MORELLO_${_k}_SOURCES ${_i} _s)
      list(GET _MORELLO_${_k}_SOURCE_ISAS ${_i} _isa)
      list(APPEND _sources "${_out}/${_s}")
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
    list(APPEND _decls "${_MORELLO_${_k}_STAMP}" ${_MORELLO_${_k}_DEPENDS})
    list(APPEND _stamps "${_out}/.stamp/${_k}.stamp")
    list(APPEND _kernel_args --kernel "${_k}")
  endforeach()
  list(LENGTH _MORELLO_KERNELS _count)

  # Build step: one command per library produces the kernels whose declaration stamps
  # changed (up to MORELLO_JOBS at once) and touches every kernel's stamp. It prints a line
  # per kernel as it starts, progress every few seconds and a summary, so it runs in
  # Ninja's console pool (USES_TERMINAL): Ninja would hold back the output of any other
  # job until it ends.
  add_custom_command(
    OUTPUT ${_stamps}
    BYPRODUCTS ${_sources} ${_byproducts}
    COMMAND ${_env} "${_py}" -m morello_build.integration build --out-dir "${_out}" ${_kernel_args}
            ${_run_args}
    DEPENDS ${_decls}
    WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}"
    USES_TERMINAL
    COMMENT "morello: kernels of ${target} (${_count})"
    VERBATIM)

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
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_VERIFY" "NAME;SPEC;EXPR;DTYPE;THREADS;TUNE;OUTPUT_DIR;HEADER_DIR_VAR" "TARGET_ISA;INPUTS")
  set(_fn "morello_add_kernel(${target})")
  if(DEFINED ARG_SPEC AND DEFINED ARG_EXPR)
    message(FATAL_ERROR "${_fn}: give either SPEC <spec-text> or EXPR <expression>, not both")
  endif()
  if(DEFINED ARG_EXPR)
    if(NOT ARG_NAME)
      message(FATAL_ERROR "${_fn}: NAME <c-name> is required")
    endif()
    if(NOT ARG_INPUTS)
      message(FATAL_ERROR "${_fn}: EXPR needs INPUTS, the shape of each input in the order the kernel takes them (e.g. INPUTS \"x=64x768,w=768x3072,b=3072\")")
    endif()
  else()
    foreach(_opt INPUTS DTYPE THREADS)
      if(DEFINED ARG_${_opt})
        message(FATAL_ERROR "${_fn}: ${_opt} applies to EXPR only (a SPEC shorthand takes --dtype and --threads)")
      endif()
    endforeach()
    if(NOT ARG_NAME OR NOT ARG_SPEC)
      message(FATAL_ERROR "${_fn}: NAME <c-name> and SPEC <spec-text> are required")
    endif()
  endif()
  set(_isas "${ARG_TARGET_ISA}")
  if(NOT _isas)
    set(_isas "${MORELLO_TARGET_ISA}")
  endif()
  if(NOT _isas)
    set(_isas native)
  endif()
  _morello_forward(_pass NO_VERIFY OUTPUT_DIR HEADER_DIR_VAR)
  # --where names the kernel in errors: SPEC "<text>" or EXPR "<text>" (the function and
  # target are added).
  if(DEFINED ARG_EXPR)
    # INPUTS is one string "x=8x16,w=16x24,b=24" or several words x=8x16 w=16x24 b=24.
    string(REPLACE ";" "," _inputs "${ARG_INPUTS}")
    set(_where "EXPR \"${ARG_EXPR}\"")
    set(_source "--expr;${ARG_EXPR};--inputs;${_inputs};--name;${ARG_NAME};--where;${_where}")
    if(DEFINED ARG_DTYPE)
      list(APPEND _source --dtype "${ARG_DTYPE}")
    endif()
    if(DEFINED ARG_THREADS)
      list(APPEND _source --threads "${ARG_THREADS}")
    endif()
  else()
    set(_where "SPEC \"${ARG_SPEC}\"")
    set(_source "--spec;${ARG_SPEC};--name;${ARG_NAME};--where;${_where}")
  endif()
  _morello_library(${target} morello_add_kernel "${_source}" "" "${_isas}" "${ARG_TUNE}" "" ${_pass})
  if(ARG_HEADER_DIR_VAR)
    set(${ARG_HEADER_DIR_VAR} "${${ARG_HEADER_DIR_VAR}}" PARENT_SCOPE)
  endif()
endfunction()

function(morello_add_kernels target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_VERIFY" "CONFIG;TUNE;OUTPUT_DIR;HEADER_DIR_VAR;_PYTHON_MODULE" "KERNELS;TARGET_ISA")
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
                   "${ARG_TUNE}" "${ARG__PYTHON_MODULE}" ${_pass})
  if(ARG_HEADER_DIR_VAR)
    set(${ARG_HEADER_DIR_VAR} "${${ARG_HEADER_DIR_VAR}}" PARENT_SCOPE)
  endif()
endfunction()

function(morello_add_python_module name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_VERIFY;NO_STABLE_ABI" "CONFIG;TUNE;OUTPUT_DIR;STABLE_ABI" "KERNELS;TARGET_ISA")
  if(NOT ARG_CONFIG)
    message(FATAL_ERROR "morello_add_python_module(${name}): CONFIG <pyproject.toml|morello.toml> is required")
  endif()
  _morello_forward(_pass NO_VERIFY TUNE OUTPUT_DIR KERNELS TARGET_ISA)
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
