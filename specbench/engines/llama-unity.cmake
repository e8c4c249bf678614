# `make engine-llama.cpp` compiles llama-server as a unity build (CMAKE_UNITY_BUILD: several sources per translation
# unit, each header parsed once per batch instead of once per source) and passes this file as CMAKE_PROJECT_INCLUDE.
# It takes out the two sources that refuse to share a translation unit: mtmd's helpers, a public library that must
# not see mtmd's internal headers (they #error in a unity batch). Run after llama.cpp's top-level project() call, the
# exclusion is deferred to the end of the top-level directory, when tools/mtmd is known.
include_guard(GLOBAL)
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL set_source_files_properties
    "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp" "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp"
    DIRECTORY "${CMAKE_SOURCE_DIR}/tools/mtmd" PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
