#!/usr/bin/env python3
"""Independent checker for safetensors files and sharded model folders (Python standard library only).

Written from the format's specification, not from SlideDP's C++ reader, so tests can confirm that
what our writer produces is what other tools expect. For each file: the 8-byte little-endian header
length, a JSON object header without duplicate keys, "__metadata__" of strings, every tensor's dtype,
shape and data_offsets, shape x dtype size == byte range, ranges tiling the data section exactly, and
(unless --allow-unpadded) the header padded to 8 bytes. For an index (model.safetensors.index.json):
every weight_map entry present in the shard it names, every shard tensor mapped to that shard, and
metadata.total_size equal to the sum of the tensor bytes.

usage: check_safetensors.py [--json] [--allow-unpadded] [--check-finite] PATH...
PATH is a .safetensors file, an index .json, or a folder holding model.safetensors or the index.
Exit status: 0 all valid, 1 some check failed, 2 usage error.
"""
import argparse
import array
import json
import os
import struct
import sys

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}
# Exponent masks for finding NaN/Inf: the exponent field all ones.
NONFINITE_MASK = {"F16": ("H", 0x7C00), "BF16": ("H", 0x7F80), "F32": ("I", 0x7F800000)}
MAX_HEADER_BYTES = 100_000_000


class CheckError(Exception):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise CheckError(f"header repeats the key {key!r}")
        seen[key] = value
    return seen


def check_file(path, allow_unpadded=False, check_finite=False):
    """Returns {"tensors": {name: {...}}, "metadata": {...}, "data_bytes": n}; raises CheckError."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckError(f"{path}: truncated: {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES:
            raise CheckError(f"{path}: header length {n} exceeds {MAX_HEADER_BYTES}")
        if 8 + n > size:
            raise CheckError(f"{path}: truncated: header length {n} but only {size - 8} bytes follow")
        raw = f.read(n)
        if not allow_unpadded and (8 + n) % 8 != 0:
            raise CheckError(f"{path}: header not padded: 8 + {n} is not a multiple of 8")
        try:
            text = raw.decode("utf-8")
            header = json.loads(text, object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckError(f"{path}: malformed JSON header: {e}") from e
        if not text.startswith("{") or not isinstance(header, dict):
            raise CheckError(f"{path}: header is not a JSON object")
        if text.rstrip(" ") != text.rstrip():
            raise CheckError(f"{path}: header padding must be spaces")
        data_bytes = size - 8 - n
        metadata = header.pop("__metadata__", {})
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise CheckError(f"{path}: __metadata__ must map strings to strings")
        tensors = {}
        for name, info in header.items():
            where = f"{path}: tensor {name!r}"
            if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
                raise CheckError(f"{where}: expected exactly dtype, shape, data_offsets")
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if dtype not in DTYPE_BYTES:
                raise CheckError(f"{where}: unknown dtype {dtype!r}")
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                      for d in shape):
                raise CheckError(f"{where}: shape must be a list of non-negative integers")
            if (not isinstance(offsets, list) or len(offsets) != 2 or
                    not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
                raise CheckError(f"{where}: data_offsets must be [begin, end]")
            numel = 1
            for d in shape:
                numel *= d
            begin, end = offsets
            if end - begin != numel * DTYPE_BYTES[dtype]:
                raise CheckError(f"{where}: shape {shape} x {dtype} is {numel * DTYPE_BYTES[dtype]} bytes, "
                                 f"data_offsets hold {end - begin}")
            if end > data_bytes:
                raise CheckError(f"{where}: data_offsets {offsets} run past the {data_bytes}-byte data section")
            tensors[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        covered = 0
        for name, info in sorted(tensors.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
            begin, end = info["data_offsets"]
            if begin != covered:
                raise CheckError(f"{path}: tensor {name!r}: begins at {begin}, expected {covered} "
                                 "(ranges must tile the data section)")
            covered = end
        if covered != data_bytes:
            raise CheckError(f"{path}: {data_bytes - covered} bytes after the last tensor")
        if check_finite:
            for name, info in tensors.items():
                if info["dtype"] not in NONFINITE_MASK:
                    continue
                code, mask = NONFINITE_MASK[info["dtype"]]
                begin, end = info["data_offsets"]
                f.seek(8 + n + begin)
                values = array.array(code)
                values.frombytes(f.read(end - begin))
                if sys.byteorder != "little":
                    values.byteswap()
                bad = sum(1 for v in values if v & mask == mask)
                if bad:
                    raise CheckError(f"{path}: tensor {name!r}: {bad} NaN/Inf values")
    return {"tensors": tensors, "metadata": metadata, "data_bytes": data_bytes}


def check_index(index_path, allow_unpadded=False, check_finite=False):
    try:
        with open(index_path, "r", encoding="utf-8") as f:
            index = json.load(f, object_pairs_hook=_no_duplicates)
    except ValueError as e:
        raise CheckError(f"{index_path}: malformed JSON: {e}") from e
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise CheckError(f"{index_path}: weight_map missing or not an object")
    folder = os.path.dirname(index_path)
    weight_map = index["weight_map"]
    shards = {}
    for shard in sorted(set(weight_map.values())):
        if not isinstance(shard, str) or "/" in shard or shard.startswith("."):
            raise CheckError(f"{index_path}: {shard!r} is not a plain shard file name")
        shard_path = os.path.join(folder, shard)
        if not os.path.exists(shard_path):
            raise CheckError(f"{index_path}: shard {shard} does not exist")
        shards[shard] = check_file(shard_path, allow_unpadded, check_finite)
    total = 0
    for shard, info in shards.items():
        for name, t in info["tensors"].items():
            if weight_map.get(name) != shard:
                raise CheckError(f"{shard}: tensor {name!r} is not mapped to this shard by the index")
            total += t["data_offsets"][1] - t["data_offsets"][0]
    for name, shard in weight_map.items():
        if name not in shards[shard]["tensors"]:
            raise CheckError(f"{index_path}: weight_map maps {name!r} to {shard}, which lacks it")
    stated = index.get("metadata", {}).get("total_size")
    if stated is not None and stated != total:
        raise CheckError(f"{index_path}: metadata.total_size is {stated}, the shards hold {total} tensor bytes")
    return {"index": index_path, "shards": shards, "total_size": total}


def check_path(path, allow_unpadded, check_finite):
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.exists(index):
            return check_index(index, allow_unpadded, check_finite)
        if os.path.exists(single):
            return {"file": single, **check_file(single, allow_unpadded, check_finite)}
        raise CheckError(f"{path}: holds neither model.safetensors nor model.safetensors.index.json")
    if path.endswith(".json"):
        return check_index(path, allow_unpadded, check_finite)
    return {"file": path, **check_file(path, allow_unpadded, check_finite)}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="safetensors file, index json, or model folder")
    parser.add_argument("--json", action="store_true", help="print every tensor's dtype, shape and offsets as JSON")
    parser.add_argument("--allow-unpadded", action="store_true",
                        help="accept headers not padded to 8 bytes (the spec allows it; our writer pads)")
    parser.add_argument("--check-finite", action="store_true", help="also fail on NaN/Inf in F16/BF16/F32 tensors")
    args = parser.parse_args(argv)
    results, errors = {}, []
    for path in args.paths:
        try:
            results[path] = check_path(path, args.allow_unpadded, args.check_finite)
        except (CheckError, OSError) as e:
            errors.append(str(e))
    if args.json:
        print(json.dumps({"results": results, "errors": errors}, indent=1, sort_keys=True))
    else:
        for path, r in results.items():
            count = sum(len(s["tensors"]) for s in r["shards"].values()) if "shards" in r else len(r["tensors"])
            print(f"ok {path}: {count} tensors")
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
