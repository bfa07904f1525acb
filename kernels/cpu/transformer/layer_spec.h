// A decoder layer's spec, whatever its family: one alternative per family. Each family's header gives
// the same overload set on its spec (layer_flat_numel, layer_saved_bytes, layer_forward, ...; on the
// GPU its kernels/cuda/*_scratch.h the sizes and *_unit.h the operations), so dispatch is one
// std::visit per operation and a new family's layer is its own files plus its alternative here.
#pragma once

#include <variant>

#include "kernels/cpu/transformer/gemma4_layer.h"
#include "kernels/cpu/transformer/llama_layer.h"    // the Llama family (Llama, Qwen2/2.5, Qwen3, Mistral)
#include "kernels/cpu/transformer/qwen3_5_layer.h"  // Qwen3.5 / Qwen3.6

namespace slidedp::kernels {

using LayerSpec = std::variant<DecoderSpec, Gemma4LayerSpec, Qwen35LayerSpec>;

}  // namespace slidedp::kernels
