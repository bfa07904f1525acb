#!/usr/bin/env python3
"""Writes N synthetic conversations as chat JSON lines (for slidedp-data build --pack measurements).

Turn lengths are log-normal in words (median ~60 words for a user turn, ~180 for an answer, a long
tail to a few thousand), 1-4 exchanges, an optional system prompt: the shape of public SFT sets
(long answers, short questions), not their text. Deterministic for a seed.
usage: synthetic_chats.py N SEED OUT.jsonl
"""
import json
import random
import sys

WORDS = ("the of and to in is that for it as with was on be by this are from at or an have not which "
         "data model layer memory host device stream update gradient token sequence step rank chunk "
         "compute time cost bytes link copy buffer state weight optimizer loss batch value result").split()


def text(rng, median_words):
    n = max(1, int(rng.lognormvariate(0, 0.9) * median_words))
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def main():
    n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed)
    with open(out, "w") as f:
        for _ in range(n):
            messages = []
            if rng.random() < 0.3:
                messages.append({"role": "system", "content": text(rng, 20)})
            for _ in range(rng.choice([1, 1, 2, 3, 4])):
                messages.append({"role": "user", "content": text(rng, 60)})
                messages.append({"role": "assistant", "content": text(rng, 180)})
            f.write(json.dumps({"messages": messages}) + "\n")


if __name__ == "__main__":
    main()
