#!/usr/bin/env python3
"""Reference implementation of the sequence order documented in docs/FORMATS.md ("Training
sequences"), independent of io/sequence_sampler.cc. Prints P_epoch(position) for each position.

usage: sampler_order.py SEED NUM_SEQUENCES EPOCH COUNT
"""
import sys

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def sequence_at(seed, num_sequences, epoch, position):
    h = 1
    while 4 ** h < num_sequences:
        h += 1
    key = splitmix64(seed ^ splitmix64(epoch))
    x = position
    while True:  # cycle-walking into [0, num_sequences)
        left, right = x >> h, x & ((1 << h) - 1)
        for r in range(6):
            f = splitmix64((key + r * 0x632BE59BD9B4E019 + right) & MASK64) & ((1 << h) - 1)
            left, right = right, left ^ f
        x = (left << h) | right
        if x < num_sequences:
            return x


if __name__ == "__main__":
    seed, n, epoch, count = (int(a) for a in sys.argv[1:5])
    print(" ".join(str(sequence_at(seed, n, epoch, p)) for p in range(count)))
