// Packing a token dataset into fixed-length training sequences, shuffling them by seed, and handing
// each (step, micro-step, rank) its disjoint share. Sequence k is tokens [k*T, k*T + T + 1): inputs are
// the first T, targets the last T (shifted by one), a target whose mask byte is 0 becomes kIgnoreIndex.
// Each epoch is a seeded permutation of the S = (N - 1) / T sequences; a step takes the next G of them
// and never straddles two epochs (the last S mod G of each permutation are skipped, different ones each
// epoch), so the G sequences of a step are always distinct. Inside a step, micro-step m covers
// positions [m*R*b, (m+1)*R*b) and rank r takes [m*R*b + r*b, m*R*b + (r+1)*b): the union over R ranks
// with micro-batch b is exactly the single-rank micro-batch R*b, rows in rank-major order.
// Packed documents (a document end id, e.g. the tokenizer's EOS): a new document starts after every
// end token; each token's position inside its document goes with the micro-batch (the kernels
// restart attention, RoPE and recurrent state there) and the target that would predict the next
// document's first token from this one's end is ignored. A window's first token starts a document.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "io/token_dataset.h"

namespace slidedp {

inline constexpr int32_t kIgnoreIndex = -100;  // target ignored by the loss (PyTorch's convention)

// Where the data stream stands: the next step starts at `position` of `epoch`'s permutation. The other
// fields identify the stream, so a resume against different data or settings fails loudly instead of
// silently training on other sequences.
struct DataCursor {
  int64_t epoch = 0;
  int64_t position = 0;       // in [0, num_sequences)
  int64_t num_sequences = 0;  // S of the dataset and seq_len that produced the cursor
  int64_t seq_len = 0;        // T
  uint64_t seed = 0;
  int64_t document_end = -1;  // the token id ending documents (packed documents), -1: none
  bool operator==(const DataCursor&) const = default;
};

struct MicroBatch {
  int64_t batch_size = 0;             // B
  int64_t seq_len = 0;                // T
  std::vector<int32_t> inputs;        // (B, T) token ids, host
  std::vector<int32_t> targets;       // (B, T) next-token ids or kIgnoreIndex, host
  std::vector<int32_t> positions;     // (B, T) position in its document; empty without document ends
  std::vector<int64_t> sequence_ids;  // (B) packed sequence index of each row (logs, tests)
  int64_t num_targets = 0;            // targets that are not kIgnoreIndex
};

class SequenceSampler {
 public:
  // Throws InputError when the dataset holds fewer than seq_len + 1 tokens or fewer sequences than
  // one global batch (a step could not be made of distinct sequences).
  // document_end: the token id that ends every document (see above); none: one stream.
  SequenceSampler(TokenDataset dataset, int64_t seq_len, int64_t global_batch_sequences, uint64_t seed,
                  std::optional<int32_t> document_end = std::nullopt);

  int64_t num_sequences() const { return num_sequences_; }          // S
  int64_t seq_len() const { return seq_len_; }                      // T
  int64_t global_batch_sequences() const { return global_batch_; }  // G
  int64_t steps_per_epoch() const { return num_sequences_ / global_batch_; }
  const TokenDataset& dataset() const { return dataset_; }
  const std::optional<int32_t>& document_end() const { return document_end_; }

  // The sequence at `position` of `epoch`'s permutation (a seeded bijection of [0, S), computed on the
  // fly: no per-epoch table, thread-safe).
  int64_t sequence_at(int64_t epoch, int64_t position) const;

  // Rank `rank` of `ranks`'s micro-batch of `micro_batch_size` sequences in micro-step `micro_step`
  // of optimizer step `step`. G must be a multiple of ranks * micro_batch_size (InputError otherwise);
  // micro_step < G / (ranks * micro_batch_size).
  MicroBatch micro_batch(int64_t step, int64_t micro_step, int rank, int ranks,
                         int64_t micro_batch_size) const;
  // The same into caller buffers (e.g. pinned memory): inputs and targets hold B*T elements each, and
  // so does positions when given (filled only with a document end). Returns the targets that count.
  int64_t fill_micro_batch(int64_t step, int64_t micro_step, int rank, int ranks, int64_t micro_batch_size,
                           std::span<int32_t> inputs, std::span<int32_t> targets,
                           std::span<int32_t> positions = {}) const;
  // S, plus one when tokens remain after the last whole sequence (which training leaves out).
  int64_t sequences_with_tail() const;
  // Sequences [first, first + rows) in their file order (evaluation: no shuffle, no epochs, the tail
  // after the last whole sequence as a part-filled row S) into (rows, T) buffers, positions as
  // fill_micro_batch's; a row past them is padding whose targets are all ignored. Returns the
  // targets that count.
  int64_t fill_sequences(int64_t first, int64_t rows, std::span<int32_t> inputs, std::span<int32_t> targets,
                         std::span<int32_t> positions = {}) const;
  // Packs sequence `sequence` into (T) inputs and targets; returns the targets that count.
  int64_t pack_sequence(int64_t sequence, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  // Targets that count over the whole global batch of `step` (the loss normaliser every rank agrees on).
  int64_t step_num_targets(int64_t step) const;

  // Where `step` begins (save this as the data cursor of a checkpoint taken after step - 1).
  DataCursor cursor_at_step(int64_t step) const;
  // Makes `step` begin at `cursor` (and later steps follow on from it). Throws InputError when the
  // cursor belongs to another stream (different S, T or seed) or is out of range. Not thread-safe:
  // call before ranks start sampling.
  void resume(const DataCursor& cursor, int64_t step);

 private:
  void epoch_and_position(int64_t step, int64_t* epoch, int64_t* position) const;
  // Whether token `index` of the dataset is a target that counts (its mask byte, and with document
  // ends, not the first token after one).
  bool target_counts(int64_t index) const;
  // Each token's position in its document (with a document end and a positions buffer).
  void fill_positions(std::span<const int32_t> inputs, std::span<int32_t> positions) const;

  TokenDataset dataset_;
  int64_t seq_len_;
  int64_t global_batch_;
  uint64_t seed_;
  int64_t num_sequences_;
  // The stream is anchored at (base_step_, base_epoch_, base_position_); the default anchor is step 0
  // at the start of epoch 0.
  int64_t base_step_ = 0;
  int64_t base_epoch_ = 0;
  int64_t base_position_ = 0;
  int half_bits_;  // Feistel half width: the permutation domain is 2^(2*half_bits_) >= S
  std::optional<int32_t> document_end_;
};

}  // namespace slidedp
