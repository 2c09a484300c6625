# find_package(MorelloBuild CONFIG) entry point.
#
# Inside a scikit-build-core build that lists morello-build in build-system.requires, the
# cmake.root entry point points CMake here. Elsewhere:
#   cmake -DMorelloBuild_DIR="$(python -m morello_build --cmake-dir)" ...
# (or that directory in CMAKE_PREFIX_PATH; MorelloBuild_ROOT is ignored by projects whose
# cmake_minimum_required is below 3.12, policy CMP0074).
# The functions live in MorelloBuild.cmake, which is also reachable as include(MorelloBuild)
# through the cmake.module entry point.

include("${CMAKE_CURRENT_LIST_DIR}/MorelloBuild.cmake")

get_property(_morello_python GLOBAL PROPERTY MORELLO_PYTHON)
if(NOT _morello_python)
  set(MorelloBuild_FOUND FALSE)
  get_property(MorelloBuild_NOT_FOUND_MESSAGE GLOBAL PROPERTY MORELLO_PYTHON_ERROR)
else()
  set(MorelloBuild_FOUND TRUE)
  set(MorelloBuild_PYTHON "${_morello_python}")
  set(MorelloBuild_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
  if(NOT MorelloBuild_FIND_QUIETLY)
    message(STATUS "morello-build ${MorelloBuild_VERSION}: generator runs with ${_morello_python}")
  endif()
endif()
unset(_morello_python)
