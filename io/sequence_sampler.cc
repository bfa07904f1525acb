// Sequence packing, seeded per-epoch permutations and disjoint (step, micro-step, rank) sharding; see
// sequence_sampler.h. The permutation is a 6-round Feistel network over 2^(2h) >= S values with
// cycle-walking into [0, S): a bijection by construction, the same on every platform (no std::shuffle,
// whose algorithm the standard leaves open), and stateless, so rank threads sample concurrently.
#include "io/sequence_sampler.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "common/hash.h"

namespace slidedp {
namespace {

constexpr int kFeistelRounds = 6;

}  // namespace

SequenceSampler::SequenceSampler(TokenDataset dataset, int64_t seq_len, int64_t global_batch_sequences,
                                 uint64_t seed, std::optional<int32_t> document_end)
    : dataset_(std::move(dataset)),
      seq_len_(seq_len),
      global_batch_(global_batch_sequences),
      seed_(seed),
      document_end_(document_end) {
  const std::string& name = dataset_.name();
  if (seq_len_ <= 0) throw InputError("seq_len", fmt::format("{} must be positive", seq_len_));
  if (global_batch_ <= 0)
    throw InputError("global_batch_sequences", fmt::format("{} must be positive", global_batch_));
  if (dataset_.num_tokens() < seq_len_ + 1)
    throw InputError(name, fmt::format("{} tokens cannot make one sequence of seq_len {} (needs {} tokens)",
                                       dataset_.num_tokens(), seq_len_, seq_len_ + 1));
  num_sequences_ = (dataset_.num_tokens() - 1) / seq_len_;
  if (num_sequences_ < global_batch_)
    throw InputError(
        name, fmt::format("{} tokens make {} sequences of {} tokens, fewer than one global batch of {}",
                          dataset_.num_tokens(), num_sequences_, seq_len_, global_batch_));
  half_bits_ = 1;
  while ((int64_t{1} << (2 * half_bits_)) < num_sequences_) ++half_bits_;
}

int64_t SequenceSampler::sequence_at(int64_t epoch, int64_t position) const {
  SLIDEDP_CHECK(position >= 0 && position < num_sequences_, "sequence position out of range");
  const uint64_t key = splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(epoch)));
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t x = static_cast<uint64_t>(position);
  // Cycle-walking: the Feistel permutation of [0, 2^2h) restricted to [0, S) by re-encrypting until
  // the value lands inside; a bijection on [0, S), ends because the cycle through x returns to [0, S).
  do {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask;
    for (int r = 0; r < kFeistelRounds; ++r) {
      uint64_t f = splitmix64(key + static_cast<uint64_t>(r) * 0x632be59bd9b4e019ull + right) & mask;
      uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(num_sequences_));
  return static_cast<int64_t>(x);
}

void SequenceSampler::epoch_and_position(int64_t step, int64_t* epoch, int64_t* position) const {
  SLIDEDP_CHECK(step >= base_step_, fmt::format("step {} precedes the resumed step {}", step, base_step_));
  const int64_t per_epoch = steps_per_epoch();
  const int64_t first_epoch_steps = (num_sequences_ - base_position_) / global_batch_;
  const int64_t k = step - base_step_;
  if (k < first_epoch_steps) {
    *epoch = base_epoch_;
    *position = base_position_ + k * global_batch_;
    return;
  }
  const int64_t rest = k - first_epoch_steps;
  *epoch = base_epoch_ + 1 + rest / per_epoch;
  *position = (rest % per_epoch) * global_batch_;
}

bool SequenceSampler::target_counts(int64_t index) const {
  if (!dataset_.counts_in_loss(index)) return false;
  // the next document's first token is not predicted from this one's end
  return !document_end_ || static_cast<int64_t>(dataset_.token(index - 1)) != *document_end_;
}

int64_t SequenceSampler::pack_sequence(int64_t sequence, std::span<int32_t> inputs,
                                       std::span<int32_t> targets) const {
  SLIDEDP_CHECK(sequence >= 0 && sequence < num_sequences_, "sequence index out of range");
  SLIDEDP_CHECK(
      static_cast<int64_t>(inputs.size()) == seq_len_ && static_cast<int64_t>(targets.size()) == seq_len_,
      "pack_sequence buffers must hold seq_len elements");
  const int64_t start = sequence * seq_len_;
  int64_t counted = 0;
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = static_cast<int32_t>(dataset_.token(start + t));
    if (target_counts(start + t + 1)) {
      targets[t] = static_cast<int32_t>(dataset_.token(start + t + 1));
      ++counted;
    } else {
      targets[t] = kIgnoreIndex;
    }
  }
  return counted;
}

int64_t SequenceSampler::fill_micro_batch(int64_t step, int64_t micro_step, int rank, int ranks,
                                          int64_t micro_batch_size, std::span<int32_t> inputs,
                                          std::span<int32_t> targets, std::span<int32_t> positions) const {
  if (ranks <= 0 || micro_batch_size <= 0)
    throw InputError("micro_batch", fmt::format("ranks {} and micro_batch_size {} must be positive", ranks,
                                                micro_batch_size));
  const int64_t per_micro_step = static_cast<int64_t>(ranks) * micro_batch_size;
  if (global_batch_ % per_micro_step != 0)
    throw InputError("global_batch_sequences",
                     fmt::format("{} is not a multiple of ranks x micro_batch_size = {} x {}", global_batch_,
                                 ranks, micro_batch_size));
  SLIDEDP_CHECK(rank >= 0 && rank < ranks, "rank out of range");
  SLIDEDP_CHECK(micro_step >= 0 && micro_step < global_batch_ / per_micro_step, "micro_step out of range");
  SLIDEDP_CHECK(static_cast<int64_t>(inputs.size()) == micro_batch_size * seq_len_ &&
                    static_cast<int64_t>(targets.size()) == micro_batch_size * seq_len_,
                "micro-batch buffers must hold micro_batch_size * seq_len elements");
  int64_t epoch = 0, position = 0;
  epoch_and_position(step, &epoch, &position);
  const int64_t first = position + micro_step * per_micro_step + rank * micro_batch_size;
  int64_t counted = 0;
  for (int64_t b = 0; b < micro_batch_size; ++b) {
    int64_t seq = sequence_at(epoch, first + b);
    counted +=
        pack_sequence(seq, inputs.subspan(b * seq_len_, seq_len_), targets.subspan(b * seq_len_, seq_len_));
  }
  fill_positions(inputs, positions);
  return counted;
}

int64_t SequenceSampler::sequences_with_tail() const {
  return num_sequences_ + (num_sequences_ * seq_len_ + 1 < dataset_.num_tokens() ? 1 : 0);
}

void SequenceSampler::fill_positions(std::span<const int32_t> inputs, std::span<int32_t> positions) const {
  if (!document_end_ || positions.empty()) return;
  SLIDEDP_CHECK(positions.size() == inputs.size(),
                "micro-batch positions must hold micro_batch_size * seq_len elements");
  for (int64_t i = 0; i < static_cast<int64_t>(inputs.size()); ++i)
    positions[i] = i % seq_len_ == 0 || inputs[i - 1] == *document_end_ ? 0 : positions[i - 1] + 1;
}

int64_t SequenceSampler::fill_sequences(int64_t first, int64_t rows, std::span<int32_t> inputs,
                                        std::span<int32_t> targets, std::span<int32_t> positions) const {
  SLIDEDP_CHECK(first >= 0 && rows > 0, "fill_sequences needs a first sequence and rows");
  SLIDEDP_CHECK(static_cast<int64_t>(inputs.size()) == rows * seq_len_ &&
                    static_cast<int64_t>(targets.size()) == rows * seq_len_,
                "fill_sequences buffers must hold rows * seq_len elements");
  int64_t counted = 0;
  for (int64_t b = 0; b < rows; ++b) {
    auto in = inputs.subspan(b * seq_len_, seq_len_);
    auto tg = targets.subspan(b * seq_len_, seq_len_);
    if (first + b < num_sequences_) {
      counted += pack_sequence(first + b, in, tg);
      continue;
    }
    std::fill(in.begin(), in.end(), 0);
    std::fill(tg.begin(), tg.end(), kIgnoreIndex);
    // The tokens after the last whole sequence, when there are any: a part-filled row.
    const int64_t start = (first + b) * seq_len_, n = dataset_.num_tokens();
    for (int64_t t = 0; first + b == num_sequences_ && start + t + 1 < n; ++t) {
      in[t] = static_cast<int32_t>(dataset_.token(start + t));
      if (target_counts(start + t + 1)) {
        tg[t] = static_cast<int32_t>(dataset_.token(start + t + 1));
        ++counted;
      }
    }
  }
  fill_positions(inputs, positions);
  return counted;
}

MicroBatch SequenceSampler::micro_batch(int64_t step, int64_t micro_step, int rank, int ranks,
                                        int64_t micro_batch_size) const {
  MicroBatch mb;
  mb.batch_size = micro_batch_size;
  mb.seq_len = seq_len_;
  mb.inputs.resize(static_cast<std::size_t>(std::max<int64_t>(0, micro_batch_size) * seq_len_));
  mb.targets.resize(mb.inputs.size());
  if (document_end_) mb.positions.resize(mb.inputs.size());
  mb.num_targets =
      fill_micro_batch(step, micro_step, rank, ranks, micro_batch_size, mb.inputs, mb.targets, mb.positions);
  int64_t epoch = 0, position = 0;
  epoch_and_position(step, &epoch, &position);
  const int64_t first = position + micro_step * ranks * micro_batch_size + rank * micro_batch_size;
  for (int64_t b = 0; b < micro_batch_size; ++b) mb.sequence_ids.push_back(sequence_at(epoch, first + b));
  return mb;
}

int64_t SequenceSampler::step_num_targets(int64_t step) const {
  int64_t epoch = 0, position = 0;
  epoch_and_position(step, &epoch, &position);
  int64_t counted = 0;
  for (int64_t j = 0; j < global_batch_; ++j) {
    const int64_t start = sequence_at(epoch, position + j) * seq_len_;
    for (int64_t t = 1; t <= seq_len_; ++t) counted += target_counts(start + t) ? 1 : 0;
  }
  return counted;
}

DataCursor SequenceSampler::cursor_at_step(int64_t step) const {
  DataCursor c;
  epoch_and_position(step, &c.epoch, &c.position);
  c.num_sequences = num_sequences_;
  c.seq_len = seq_len_;
  c.seed = seed_;
  c.document_end = document_end_ ? *document_end_ : -1;
  return c;
}

void SequenceSampler::resume(const DataCursor& cursor, int64_t step) {
  if (cursor.num_sequences != num_sequences_ || cursor.seq_len != seq_len_)
    throw InputError(
        "data cursor",
        fmt::format("was saved for {} sequences of {} tokens; {} with seq_len {} makes {}",
                    cursor.num_sequences, cursor.seq_len, dataset_.name(), seq_len_, num_sequences_));
  if (cursor.seed != seed_)
    throw InputError("data cursor",
                     fmt::format("was saved with seed {}, this run uses seed {}", cursor.seed, seed_));
  const int64_t document_end = document_end_ ? *document_end_ : -1;
  if (cursor.document_end != document_end) {
    auto say = [](int64_t id) { return id < 0 ? std::string("none") : std::to_string(id); };
    throw InputError("data cursor", fmt::format("was saved with document end {}, this run has {} (--document-end)",
                                                say(cursor.document_end), say(document_end)));
  }
  if (cursor.epoch < 0 || cursor.position < 0 || cursor.position >= num_sequences_ || step < 0)
    throw InputError("data cursor", fmt::format("epoch {} position {} is out of range (S = {})", cursor.epoch,
                                                cursor.position, num_sequences_));
  base_step_ = step;
  base_epoch_ = cursor.epoch;
  base_position_ = cursor.position;
  // A cursor too close to the end of its epoch for one more step starts the next epoch.
  if (num_sequences_ - base_position_ < global_batch_) {
    base_epoch_ += 1;
    base_position_ = 0;
  }
}

}  // namespace slidedp
