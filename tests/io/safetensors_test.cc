// safetensors: a hand-built file read back (independent of our writer), the writer's output checked
// byte by byte against the spec, one test per corruption (each error names the file and the tensor),
// a mutation fuzzer (only typed errors or success, never a crash), sharded index validation, and the
// F16 conversion checked over all 65536 values.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "common/bf16.h"
#include "common/error.h"
#include "io/fp16.h"
#include "io_test_util.h"

namespace slidedp {
namespace {

using testing::TempDir;
using testing::write_bytes;

// u64 length + header + data, the header padded with spaces to 8 bytes when `pad`.
std::string make_file(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

template <typename T>
std::string raw(std::initializer_list<T> values) {
  std::string s;
  for (T v : values) s.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return s;
}

std::span<const uint8_t> as_span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Safetensors, ReadsAHandBuiltFileOfEachFloatDtype) {
  TempDir dir;
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("c":{"dtype":"F16","shape":[2],"data_offsets":[12,16]},"__metadata__":{"format":"pt"}})";
  // b: bf16 1.0 = 0x3f80, -0.5 = 0xbf00; c: f16 1.0 = 0x3c00, 65504 = 0x7bff (largest finite half).
  const std::string data =
      raw<float>({1.5f, -2.0f}) + raw<uint16_t>({0x3f80, 0xbf00}) + raw<uint16_t>({0x3c00, 0x7bff});
  write_bytes(dir / "m.safetensors", make_file(header, data, /*pad=*/false));

  SafetensorsFile f(dir / "m.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // file order
  EXPECT_EQ(f.tensors()[2].name, "c");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const SafetensorsEntry* b = f.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, TensorDtype::kBF16);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{1, 2}));
  std::vector<float> out(2);
  f.read_fp32(*f.find("a"), out);
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f}));
  f.read_fp32(*b, out);
  EXPECT_EQ(out, (std::vector<float>{1.0f, -0.5f}));
  f.read_fp32(*f.find("c"), out);
  EXPECT_EQ(out, (std::vector<float>{1.0f, 65504.0f}));
  EXPECT_EQ(f.find("d"), nullptr);
}

TEST(Safetensors, WriterFollowsTheSpecByteForByte) {
  TempDir dir;
  std::vector<float> a = {1.0f, -2.5f, 3.14159f, 1e-3f, -0.0f, 65504.0f};
  std::vector<float> b = {0.1f, 0.2f, 0.3f};
  std::vector<TensorToWrite> tensors = {{"layer.a", {2, 3}, a}, {"b", {3}, b}, {"empty", {0, 4}, {}}};
  for (TensorDtype dtype : {TensorDtype::kBF16, TensorDtype::kF16, TensorDtype::kF32}) {
    SCOPED_TRACE(tensor_dtype_name(dtype));
    SafetensorsWriteOptions opt;
    opt.dtype = dtype;
    const std::string path = dir / "w.safetensors";
    int64_t data_bytes = write_safetensors(path, tensors, opt);
    const int64_t elem = tensor_dtype_bytes(dtype);
    EXPECT_EQ(data_bytes, 9 * elem);

    std::string bytes = testing::read_bytes(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << "header must be padded to 8 bytes";
    EXPECT_EQ(bytes.size(), 8 + n + static_cast<uint64_t>(data_bytes));
    std::string header = bytes.substr(8, n);
    EXPECT_EQ(header.front(), '{');
    auto j = nlohmann::json::parse(header);  // trailing spaces are valid JSON whitespace
    EXPECT_EQ(j["__metadata__"]["format"], "pt");
    EXPECT_EQ(j["layer.a"]["dtype"], tensor_dtype_name(dtype));
    EXPECT_EQ(j["layer.a"]["shape"], nlohmann::json::array({2, 3}));
    EXPECT_EQ(j["layer.a"]["data_offsets"], nlohmann::json::array({0, 6 * elem}));
    EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({6 * elem, 9 * elem}));
    EXPECT_EQ(j["empty"]["data_offsets"], nlohmann::json::array({9 * elem, 9 * elem}));

    // The stored bits are the scalar reference conversions.
    const char* data = bytes.data() + 8 + n;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (dtype == TensorDtype::kF32) {
        float v;
        std::memcpy(&v, data + 4 * i, 4);
        EXPECT_EQ(std::bit_cast<uint32_t>(v), std::bit_cast<uint32_t>(a[i]));
      } else {
        uint16_t v;
        std::memcpy(&v, data + 2 * i, 2);
        EXPECT_EQ(v, dtype == TensorDtype::kBF16 ? float_to_bf16(a[i]) : float_to_half(a[i]));
      }
    }
    SafetensorsFile f(path);
    std::vector<float> back(3);
    f.read_fp32(*f.find("b"), back);
    for (std::size_t i = 0; i < b.size(); ++i) {
      float expect = dtype == TensorDtype::kF32    ? b[i]
                     : dtype == TensorDtype::kBF16 ? round_to_bf16(b[i])
                                                   : half_to_float(float_to_half(b[i]));
      EXPECT_EQ(back[i], expect);
    }
  }
}

struct Corruption {
  const char* label;
  std::string file;
  bool io_error;                       // IoError (truncation) rather than InputError
  std::vector<std::string> must_name;  // substrings the message must carry
};

std::vector<Corruption> corruptions() {
  const std::string ok_t = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string d8 = raw<float>({1.0f, 2.0f});
  std::vector<Corruption> c;
  c.push_back({"shorter than the length field", "abc", true, {"truncated"}});
  {
    uint64_t n = 1ull << 40;
    c.push_back({"absurd header length",
                 std::string(reinterpret_cast<const char*>(&n), 8) + "{}",
                 false,
                 {"exceeds"}});
  }
  {
    uint64_t n = 4000;
    c.push_back({"header length past the end",
                 std::string(reinterpret_cast<const char*>(&n), 8) + "{\"t\":1}",
                 true,
                 {"truncated", "4000"}});
  }
  c.push_back({"not JSON", make_file("{\"t\": [1, 2", d8), false, {"malformed JSON"}});
  c.push_back({"not an object", make_file("[1, 2, 3]", ""), false, {"'{'"}});
  c.push_back({"unknown dtype",
               make_file(R"({"t":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", d8),
               false,
               {"'t'", "F17"}});
  c.push_back({"negative dim",
               make_file(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
               false,
               {"'t'", "shape"}});
  c.push_back({"fractional dim",
               make_file(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", d8),
               false,
               {"'t'", "shape"}});
  c.push_back({"shape disagrees with range",
               make_file(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
               false,
               {"'t'", "12 bytes"}});
  c.push_back({"dtype disagrees with range",
               make_file(R"({"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", d8),
               false,
               {"'t'", "BF16"}});
  c.push_back({"range past the data",
               make_file(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8),
               true,
               {"'t'", "past"}});
  c.push_back({"truncated data", make_file("{" + ok_t + "}", d8.substr(0, 5)), true, {"'t'", "truncated"}});
  c.push_back(
      {"overlapping ranges",
       make_file(
           R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           d8),
       false,
       {"'u'", "overlap", "'t'"}});
  c.push_back(
      {"gap between tensors",
       make_file(
           R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"u":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
           d8),
       false,
       {"'u'", "no tensor"}});
  c.push_back(
      {"trailing bytes", make_file("{" + ok_t + "}", d8 + "xxxx"), false, {"4 bytes after the last tensor"}});
  c.push_back({"duplicate tensor", make_file("{" + ok_t + "," + ok_t + "}", d8), false, {"repeats", "'t'"}});
  c.push_back({"metadata not strings",
               make_file("{" + ok_t + R"(,"__metadata__":{"format":1}})", d8),
               false,
               {"__metadata__.format"}});
  c.push_back({"unknown tensor key",
               make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"stride":[1]}})", d8),
               false,
               {"'t'", "stride"}});
  c.push_back({"offsets not a pair",
               make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8),
               false,
               {"'t'", "data_offsets"}});
  c.push_back({"end before begin",
               make_file(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d8),
               false,
               {"'t'", "before begin"}});
  c.push_back({"missing dtype",
               make_file(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", d8),
               false,
               {"'t'", "dtype"}});
  c.push_back({"overflowing shape",
               make_file(R"({"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8),
               false,
               {"'t'", "overflow"}});
  c.push_back({"empty tensor name",
               make_file(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8),
               false,
               {"empty name"}});
  return c;
}

TEST(Safetensors, EveryCorruptionIsATypedErrorNamingFileAndTensor) {
  TempDir dir;
  for (const auto& c : corruptions()) {
    SCOPED_TRACE(c.label);
    const std::string path = dir / "bad.safetensors";
    write_bytes(path, c.file);
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << "accepted a corrupt file";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), c.io_error ? ErrorKind::kIo : ErrorKind::kInput) << e.what();
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const auto& s : c.must_name)
        EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in: " << msg;
    }
  }
}

TEST(Safetensors, NonFloatTensorIsAnErrorWhenReadAsWeights) {
  TempDir dir;
  write_bytes(dir / "i.safetensors",
              make_file(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", raw<int64_t>({7})));
  SafetensorsFile f(dir / "i.safetensors");
  std::vector<float> out(1);
  try {
    f.read_fp32(*f.find("ids"), out);
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'ids'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("I64"), std::string::npos) << msg;
    EXPECT_NE(msg.find("i.safetensors"), std::string::npos) << msg;
  }
}

// Mutates a valid file at random (byte flips in the length field and header, truncations, length
// field rewrites). Each outcome must be success with every range inside the file, or a typed error.
TEST(Safetensors, FuzzedHeadersNeverCrash) {
  std::vector<float> a(10, 1.0f), b(7, 2.0f), c(3, 3.0f);
  std::vector<TensorToWrite> tensors = {{"model.a", {2, 5}, a}, {"model.b", {7}, b}, {"c", {1, 3}, c}};
  TempDir dir;
  write_safetensors(dir / "ok.safetensors", tensors);
  const std::string good = testing::read_bytes(dir / "ok.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  std::mt19937_64 rng(12345);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string f = good;
    switch (rng() % 4) {
      case 0:  // flip 1-4 bytes inside the length field or header
        for (int k = 0, m = 1 + static_cast<int>(rng() % 4); k < m; ++k)
          f[rng() % (8 + n)] = static_cast<char>(rng());
        break;
      case 1:  // replace one header byte with a JSON-significant character
        f[8 + rng() % n] = "{}[]\",:0123456789-e. "[rng() % 21];
        break;
      case 2:  // truncate anywhere
        f.resize(rng() % f.size());
        break;
      default: {  // a lying length field
        uint64_t len = rng() % 2 ? rng() % (2 * n + 16) : rng();
        std::memcpy(f.data(), &len, 8);
      }
    }
    try {
      SafetensorsHeader h = parse_safetensors(as_span(f), "fuzz.safetensors");
      for (const auto& e : h.tensors) {
        ASSERT_LE(h.data_start + e.end, f.size());
        ASSERT_EQ(e.end - e.begin, static_cast<uint64_t>(e.numel * tensor_dtype_bytes(e.dtype)));
      }
      ++accepted;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("fuzz.safetensors"), std::string::npos) << e.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 2000);  // most mutations break the file
  EXPECT_GT(accepted, 0);     // some (e.g. a changed digit of a padding space) leave it valid
}

TEST(Safetensors, IndexValidationNamesTheIndexAndTheTensor) {
  TempDir dir;
  std::vector<float> v(4, 0.5f);
  write_safetensors(dir / "s1.safetensors", std::vector<TensorToWrite>{{"x", {4}, v}});
  write_safetensors(dir / "s2.safetensors", std::vector<TensorToWrite>{{"y", {2, 2}, v}, {"z", {4}, v}});
  const std::string index = dir / "model.safetensors.index.json";

  write_bytes(
      index,
      R"({"metadata":{"total_size":24},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors","z":"s2.safetensors"}})");
  SafetensorsSet ok = SafetensorsSet::open_model_dir(dir.path());
  EXPECT_EQ(ok.all().size(), 3u);
  ASSERT_TRUE(ok.find("z").has_value());
  EXPECT_NE(ok.find("z")->file->path().find("s2.safetensors"), std::string::npos);

  struct Case {
    const char* label;
    const char* json;
    std::vector<std::string> must_name;
  };
  const Case cases[] = {
      {"tensor mapped to a shard without it",
       R"({"weight_map":{"x":"s2.safetensors","y":"s2.safetensors","z":"s2.safetensors"}})",
       {"weight_map.x", "s2.safetensors"}},
      {"shard tensor not in the map",
       R"({"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})",
       {"'z'", "not mapped"}},
      {"path escaping the folder",
       R"({"weight_map":{"x":"../s1.safetensors"}})",
       {"weight_map.x", "plain file name"}},
      {"missing weight_map", R"({"metadata":{}})", {"weight_map"}},
      {"unknown key", R"({"weight_map":{"x":"s1.safetensors"},"extra":1})", {"extra"}},
      {"malformed", R"({"weight_map": {)", {"malformed JSON"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    write_bytes(index, c.json);
    try {
      SafetensorsSet::open_index(index);
      ADD_FAILURE() << "accepted a bad index";
    } catch (const InputError& e) {
      std::string msg = e.what();
      for (const auto& s : c.must_name) EXPECT_NE(msg.find(s), std::string::npos) << msg;
    }
  }
  write_bytes(index, R"({"weight_map":{"x":"s1.safetensors","w":"missing.safetensors"}})");
  EXPECT_THROW(SafetensorsSet::open_index(index), IoError);
}

TEST(Fp16, EveryHalfValueRoundTripsExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f)))) << h;
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  // Midpoints between neighbouring halves go to the even one; just above goes up.
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3c00);             // tie between 1 and 1+2^-10: even (1)
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie between 1+2^-10 and 1+2^-9: even
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie: up
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);                    // below the overflow midpoint
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);                    // midpoint to 2^16 rounds to Inf
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);                    // tie with zero: even (zero)
  EXPECT_EQ(float_to_half(0x1p-25f + 0x1p-35f), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_half(-0x1p-24f * 3.5f), 0x8004);            // 3.5 ulp: tie, to even 4
  EXPECT_EQ(float_to_half(0x1p-14f - 0x1p-25f), 0x0400);         // rounds up into the normal range
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
  // Every float between two adjacent halves rounds to the nearer one (sampled densely).
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    // Log-uniform magnitudes from 2^-26 (below the smallest subnormal) to 2^16 (above the largest half).
    float mant = 1.0f + static_cast<float>(rng() % (1u << 23)) * 0x1p-23f;
    float f = std::ldexp(mant, static_cast<int>(rng() % 43) - 26) * (rng() % 2 ? -1.0f : 1.0f);
    if (std::fabs(f) >= 65504.0f) continue;
    uint16_t h = float_to_half(f);
    double got = half_to_float(h);
    double up = half_to_float(static_cast<uint16_t>(h + 1)),
           down = half_to_float(static_cast<uint16_t>(h - 1));
    if ((h & 0x7fff) != 0x7bff && (h & 0x7fff) != 0) {
      ASSERT_LE(std::fabs(got - f), std::fabs(up - f)) << f;
      ASSERT_LE(std::fabs(got - f), std::fabs(down - f)) << f;
    }
  }
}

}  // namespace
}  // namespace slidedp
