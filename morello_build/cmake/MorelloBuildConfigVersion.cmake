# Version check for find_package(MorelloBuild <version>).
#
# The version is read from the Python package next to this directory, so the wheel has a
# single source of truth. While the major version is 0, a minor bump may break the CMake
# functions, so 0.x only satisfies requests for the same 0.x.

file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../__init__.py" _morello_version_line
     REGEX "^__version__ *= *")
string(REGEX REPLACE "^__version__ *= *[\"']([^\"']*)[\"'].*" "\\1" PACKAGE_VERSION
       "${_morello_version_line}")
unset(_morello_version_line)

set(PACKAGE_VERSION_COMPATIBLE FALSE)
set(PACKAGE_VERSION_EXACT FALSE)
if(NOT PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
elseif(NOT PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION)
  string(REGEX MATCH "^[0-9]+" _morello_have_major "${PACKAGE_VERSION}")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _morello_have_minor "${PACKAGE_VERSION}")
  if(_morello_have_major STREQUAL "0")
    if(_morello_have_minor VERSION_EQUAL
       "${PACKAGE_FIND_VERSION_MAJOR}.${PACKAGE_FIND_VERSION_MINOR}")
      set(PACKAGE_VERSION_COMPATIBLE TRUE)
    endif()
  elseif(_morello_have_major STREQUAL PACKAGE_FIND_VERSION_MAJOR)
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
  unset(_morello_have_major)
  unset(_morello_have_minor)
endif()
if(PACKAGE_VERSION VERSION_EQUAL PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
