# The layering test: which layer may include and link which. Fails naming every
# file and include (or CMake link) that crosses a layer boundary.
# Usage: cmake -DROOT=<source dir> -P check_layering.cmake
#
# Layers, one folder and one library each (cellm_<layer>):
#   core    the neutral batching core: the C++ standard library and core only
#   model   config, safetensors, weights, shared model math: core + model
#   text    tokenizer, chat template, Jinja: core + text
#   grammar constrained decoding (grammars, token masks): core + grammar
#   cpu     the CPU executor: core + model (never text or cuda)
#   cuda    the CUDA executor: core + model (never cpu or text)
#   engine  the Engine façade: every library's public headers
#   serve   the serving library: core + text + grammar + engine
# A layer may include its own internal headers ("<layer>/...", or a bare name
# beside the including file) and the public and internal headers of the layers it
# may use; engine and serve use other layers through their public headers only.
cmake_minimum_required(VERSION 3.25)

set(LAYERS core model text grammar cpu cuda engine serve)
set(ALLOWED_core core)
set(ALLOWED_model core model)
set(ALLOWED_text core text)
set(ALLOWED_grammar core grammar)
set(ALLOWED_cpu core model cpu)
set(ALLOWED_cuda core model cuda)
set(ALLOWED_engine core model text grammar cpu cuda engine)
set(ALLOWED_serve core text grammar engine serve)

# Every public header of include/cellm, by layer. A new header must be added here.
set(PUBLIC_core decode_first_scheduler.h executor.h logits_processor.h metrics.h runner.h sampler.h
                scheduler.h status.h types.h)
set(PUBLIC_model dtype.h gguf.h model_config.h model_weights.h tensor_parallel.h)
set(PUBLIC_text chat_template.h tokenizer.h)
set(PUBLIC_grammar grammar.h)
set(PUBLIC_cpu cpu_executor.h weight_quant.h)
set(PUBLIC_cuda cuda_executor.h gpu_power.h)
set(PUBLIC_engine engine.h)
set(PUBLIC_serve chat_output.h serve.h)

# Angle-bracket headers that belong to one layer's dependency: CUDA and its
# libraries to cuda; PCRE2 and utf8proc to text. The HTTP library belongs to the
# `cellm serve` front end in tools/, never to a library.
set(CUDA_HEADERS "^(cuda|cublas|cupti|nvtx|nvrtc|curand|cooperative_groups|cub/|thrust/)")
set(TEXT_HEADERS "^(pcre2|utf8proc)")
set(TOOL_HEADERS "^httplib")

set(bad "")

# The layer of public header `name` in OUT, or "" when unclassified.
function(public_layer name out)
  set(found "")
  foreach(layer ${LAYERS})
    if(name IN_LIST PUBLIC_${layer})
      set(found ${layer})
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# Checks every #include of `file`, which belongs to `layer`.
function(check_file file layer)
  set(allowed ${ALLOWED_${layer}})
  string(REPLACE ";" ", " allowed_text "${allowed}")
  get_filename_component(dir ${file} DIRECTORY)
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line ${lines})
    string(STRIP "${line}" line)
    set(why "")
    if(line MATCHES "#[ \t]*include[ \t]*<([^>]+)>")
      set(h "${CMAKE_MATCH_1}")
      if(h MATCHES "${CUDA_HEADERS}" AND NOT layer STREQUAL "cuda")
        set(why "CUDA headers belong to src/cuda")
      elseif(h MATCHES "${TEXT_HEADERS}" AND NOT layer STREQUAL "text")
        set(why "this library belongs to src/text")
      elseif(h MATCHES "${TOOL_HEADERS}")
        set(why "the HTTP library belongs to tools/cellm/serve")
      elseif(layer STREQUAL "core" AND NOT h MATCHES "^[a-z_0-9]+$")
        set(why "core includes only the C++ standard library")
      endif()
    elseif(line MATCHES "#[ \t]*include[ \t]*\"cellm/([^\"]+)\"")
      public_layer("${CMAKE_MATCH_1}" target)
      if(target STREQUAL "")
        set(why "include/cellm/${CMAKE_MATCH_1} is not classified in cmake/check_layering.cmake")
      elseif(NOT target IN_LIST allowed)
        set(why "the ${target} layer; ${layer} may include only: ${allowed_text}")
      endif()
    elseif(line MATCHES "#[ \t]*include[ \t]*\"([a-z_]+)/[^\"]+\"")
      set(target "${CMAKE_MATCH_1}")
      if(NOT target IN_LIST LAYERS)
        set(why "not a layer folder of src/")
      elseif(layer MATCHES "^(engine|serve)$" AND NOT target STREQUAL layer)
        set(why "${layer} uses other layers through their public headers (include/cellm)")
      elseif(NOT target IN_LIST allowed)
        set(why "the ${target} layer; ${layer} may include only: ${allowed_text}")
      endif()
    elseif(line MATCHES "#[ \t]*include[ \t]*\"([^\"/]+)\"")
      if(NOT EXISTS "${dir}/${CMAKE_MATCH_1}")
        set(why "not beside the file: include it by its layer-qualified path")
      endif()
    else()
      set(why "include by a layer-qualified path (\"<layer>/...\") or \"cellm/...\"")
    endif()
    if(why)
      file(RELATIVE_PATH rel ${ROOT} ${file})
      set(bad "${bad}  ${rel}: ${line}  (${why})\n")
    endif()
  endforeach()
  set(bad "${bad}" PARENT_SCOPE)
endfunction()

# Sources of each layer folder that exists.
foreach(layer ${LAYERS})
  if(NOT IS_DIRECTORY ${ROOT}/src/${layer})
    continue()
  endif()
  file(GLOB_RECURSE files ${ROOT}/src/${layer}/*.h ${ROOT}/src/${layer}/*.cpp
       ${ROOT}/src/${layer}/*.cu ${ROOT}/src/${layer}/*.cuh)
  foreach(f ${files})
    check_file(${f} ${layer})
  endforeach()
endforeach()
# A folder of src/ that is no layer is itself an error: it would go unchecked.
file(GLOB src_dirs LIST_DIRECTORIES true ${ROOT}/src/*)
foreach(d ${src_dirs})
  get_filename_component(name ${d} NAME)
  if(IS_DIRECTORY ${d} AND NOT name IN_LIST LAYERS)
    set(bad "${bad}  src/${name}: a folder that is no layer (add it to cmake/check_layering.cmake)\n")
  endif()
endforeach()

# Public headers, each by its layer.
file(GLOB public_headers ${ROOT}/include/cellm/*.h)
foreach(f ${public_headers})
  get_filename_component(name ${f} NAME)
  public_layer(${name} layer)
  if(layer STREQUAL "")
    set(bad "${bad}  include/cellm/${name}: not classified by layer in cmake/check_layering.cmake\n")
  else()
    check_file(${f} ${layer})
  endif()
endforeach()

# CMake: a layer's library links only the libraries of the layers it may use, and
# no library exports src/ (its internal headers) as a PUBLIC or INTERFACE path.
foreach(layer ${LAYERS})
  set(cmake_file ${ROOT}/src/${layer}/CMakeLists.txt)
  if(NOT EXISTS ${cmake_file})
    continue()
  endif()
  file(READ ${cmake_file} text)
  string(REGEX REPLACE "#[^\n]*" "" text "${text}")  # comments
  string(REGEX MATCHALL "target_(link_libraries|include_directories)[ \t\n]*\\([^)]*\\)" calls
         "${text}")
  foreach(call ${calls})
    string(REGEX REPLACE "^target_[a-z_]+[ \t\n]*\\(" "" args "${call}")
    string(REGEX REPLACE "\\)$" "" args "${args}")
    string(REGEX REPLACE "[ \t\n]+" ";" args "${args}")
    list(FILTER args EXCLUDE REGEX "^$")
    list(GET args 0 target)
    list(REMOVE_AT args 0)
    string(REPLACE ";" ", " allowed_text "${ALLOWED_${layer}}")
    if(call MATCHES "^target_link_libraries")
      foreach(lib ${args})
        if(lib MATCHES "^cellm_([a-z]+)$" AND CMAKE_MATCH_1 IN_LIST LAYERS)
          if(NOT CMAKE_MATCH_1 IN_LIST ALLOWED_${layer})
            set(bad "${bad}  src/${layer}/CMakeLists.txt: ${target} links ${lib}  (${layer} may link only: ${allowed_text})\n")
          endif()
        endif()
      endforeach()
    else()
      set(scope "")
      foreach(arg ${args})
        if(arg MATCHES "^(PUBLIC|PRIVATE|INTERFACE|SYSTEM|BEFORE|AFTER)$")
          if(NOT arg MATCHES "^(SYSTEM|BEFORE|AFTER)$")
            set(scope ${arg})
          endif()
        elseif(scope MATCHES "^(PUBLIC|INTERFACE)$" AND
               arg MATCHES "(/src/?$|CMAKE_CURRENT_SOURCE_DIR)")
          set(bad "${bad}  src/${layer}/CMakeLists.txt: ${target} exports ${arg} as ${scope}  (src/ is a PRIVATE include path)\n")
        endif()
      endforeach()
    endif()
  endforeach()
endforeach()

if(bad)
  message(FATAL_ERROR "layering: includes or links that cross a layer boundary:\n${bad}")
endif()
message(STATUS "layering: every layer of ${ROOT}/src includes and links only what it may")
