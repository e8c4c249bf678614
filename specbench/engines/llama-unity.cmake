# `make engine-llama.cpp` compiles llama-server as a unity build (CMAKE_UNITY_BUILD: several sources per translation
# unit, each header parsed once per batch instead of once per source) and passes this file as CMAKE_PROJECT_INCLUDE.
# It takes out the two sources that refuse to share a translation unit: mtmd's helpers, a public library that must
# not see mtmd's internal headers (they #error in a unity batch). Run after llama.cpp's top-level project() call, the
# exclusion is deferred to the end of the top-level directory, when tools/mtmd is known.
include_guard(GLOBAL)
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL set_source_files_properties
    "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp" "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp"
    DIRECTORY "${CMAKE_SOURCE_DIR}/tools/mtmd" PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)

# With SPECBENCH_O1_OUTSIDE_GGML (the CPU build sets it), everything but ggml compiles at -O1: the server, its HTTP
# library, llama.cpp's common library, mtmd and libllama (graph building, sampling, the KV cache's bookkeeping); ggml,
# whose kernels do the arithmetic, stays at the Release build's -O3. On the 2-core AMD EPYC (Zen 4), quiet, the unity
# build of llama-server took 226 s instead of 275 with the server's code at -O1, and 195 s instead of 231 with libllama
# and the HTTP library too; each pair of binaries decoded the embedded model alike (-t 1, 192 tokens, rounds
# alternated: 78.5 against 77.9 tokens/s; then 72.9 against 74.3 greedy, 70.6 both sampled, 69.9 against 67.5 with
# itself as its draft model).
function(specbench_o1_outside_ggml)
    foreach(target llama-server llama-server-impl server-context llama-common llama-common-base mtmd llama cpp-httplib)
        if(TARGET ${target})
            set_property(TARGET ${target} APPEND PROPERTY COMPILE_OPTIONS -O1)
        endif()
    endforeach()
endfunction()
if(SPECBENCH_O1_OUTSIDE_GGML)
    cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL specbench_o1_outside_ggml)
endif()
