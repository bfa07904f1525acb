// Structure-aware mutations for the replay runner: every crash and exit 1 the reliability review found
// came from a hostile value inside an otherwise valid document (a 0 rate, 1e400, 2^62, a list where a
// scalar belongs, a repeated key), none from random bytes. So the mutations keep the document and
// change its values: numbers replaced by extremes, scalars by lists, maps, null or nothing, lines
// repeated, dropped or cut, and for binary formats the leading length field too.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace slidedp::fuzz {

// One mutated variant of `input` (1-3 mutations), deterministic in `rng`.
std::string mutate(const std::string& input, std::mt19937_64& rng);

}  // namespace slidedp::fuzz
