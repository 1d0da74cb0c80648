// Checkpoint I/O (trainer/checkpoint): safetensors round trips of every dtype bit for bit, sharded folders, every kind
// of corrupt file or index rejected with its reason, the Qwen3.5 name mapping, and the Hugging Face golden's
// model.safetensors (written by the Python safetensors library) read back with the names and sums it records.
#include "trainer/checkpoint/qwen35_names.h"
#include "trainer/checkpoint/safetensors.h"

#include "tests/support/env.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fusepack::test {
namespace {

using checkpoint::Metadata;
using checkpoint::TensorMap;
using checkpoint::write_checkpoint;
using checkpoint::write_safetensors;
using nlohmann::json;

// File system helpers through POSIX: std::filesystem calls in a binary linked with libtorch.so bind to the copies that
// library exports, and its remove_all crashed on a non-empty folder (see trainer/checkpoint/safetensors.cpp).
bool exists(std::string const& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> safetensors_files(std::string const& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  while (dirent const* e = d != nullptr ? ::readdir(d) : nullptr) {
    std::string const name = e->d_name;
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) names.push_back(name);
  }
  if (d != nullptr) ::closedir(d);
  return names;
}

// A fresh folder under $TMPDIR (or /tmp), removed with its contents when the test ends.
class TempDir {
 public:
  TempDir() {
    char const* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/fusepack_safetensors_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern + " failed");
    path_ = pattern;
  }
  ~TempDir() {
    ::nftw(
        path_.c_str(), [](char const* p, struct stat const*, int, struct FTW*) { return std::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  TempDir(TempDir const&) = delete;
  TempDir& operator=(TempDir const&) = delete;
  std::string file(std::string const& name) const { return path_ + "/" + name; }
  std::string const& path() const { return path_; }

 private:
  std::string path_;
};

// Same dtype, shape and bytes (NaN payloads and -0 included).
::testing::AssertionResult bitwise_equal(at::Tensor const& a, at::Tensor const& b) {
  if (a.scalar_type() != b.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << a.scalar_type() << " vs " << b.scalar_type();
  }
  if (a.sizes() != b.sizes()) return ::testing::AssertionFailure() << "shape " << a.sizes() << " vs " << b.sizes();
  at::Tensor const ca = a.contiguous(), cb = b.contiguous();
  std::size_t const n = static_cast<std::size_t>(ca.numel()) * ca.element_size();
  if (n > 0 && std::memcmp(ca.data_ptr(), cb.data_ptr(), n) != 0) {
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

void expect_same_tensors(TensorMap const& expected, TensorMap const& got) {
  ASSERT_EQ(expected.size(), got.size());
  for (auto const& [name, t] : expected) {
    auto const it = got.find(name);
    ASSERT_NE(it, got.end()) << "missing " << name;
    EXPECT_TRUE(bitwise_equal(t, it->second)) << name;
  }
}

// `statement` must throw std::runtime_error whose message contains every one of `parts`; the message is printed so
// the log shows what a user would see.
void expect_error(std::function<void()> const& statement, std::vector<std::string> const& parts) {
  try {
    statement();
    ADD_FAILURE() << "expected std::runtime_error containing '" << parts.front() << "'";
  } catch (std::runtime_error const& e) {
    std::printf("[  error   ] %s\n", e.what());
    for (std::string const& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "missing '" << part << "' in: " << e.what();
    }
  }
}

// A safetensors file byte by byte: 8-byte little-endian `header_len` (default: the header's size), header, buffer.
void write_raw(std::string const& path, std::string const& header, std::string const& buffer,
               std::uint64_t header_len = std::numeric_limits<std::uint64_t>::max()) {
  std::uint64_t n = header_len == std::numeric_limits<std::uint64_t>::max() ? header.size() : header_len;
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i, n >>= 8) out.put(static_cast<char>(n & 0xff));
  out << header << buffer;
}

std::string read_text(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One tensor of each dtype with values that exercise it: every BF16 bit pattern (NaNs, infinities, subnormals, -0),
// random floats, integers including their extremes, booleans.
TensorMap every_dtype(std::uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  TensorMap t;
  t["bf16.all_bit_patterns"] = at::arange(0, 65536, at::kInt).to(at::kShort).view(at::kBFloat16).reshape({256, 256});
  t["f16.all_bit_patterns"] = at::arange(0, 65536, at::kInt).to(at::kShort).view(at::kHalf);
  t["f64"] = at::randn({3, 5}, gen, at::kDouble);
  t["f32"] = at::randn({2, 3, 4}, gen, at::kFloat);
  t["i64"] = at::cat({at::randint(-1000000, 1000000, {9}, gen, at::kLong),
                      at::tensor({std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()},
                                 at::kLong)});
  t["i32"] = at::randint(std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max(), {4, 4},
                         gen, at::kInt);
  t["i16"] = at::arange(-32768, 32768, 257, at::kInt).to(at::kShort);
  t["i8"] = at::arange(-128, 128, at::kInt).to(at::kChar);
  t["u8"] = at::arange(0, 256, at::kInt).to(at::kByte).reshape({16, 16});
  t["bool"] = at::randint(0, 2, {3, 7}, gen, at::kLong).to(at::kBool);
  return t;
}

TEST(Safetensors, RoundTripsEveryDtypeBitForBit) {
  TempDir dir;
  TensorMap const tensors = every_dtype(test_seed());
  write_safetensors(dir.file("all.safetensors"), tensors);
  checkpoint::Safetensors const read = checkpoint::read_safetensors(dir.file("all.safetensors"));
  expect_same_tensors(tensors, read.tensors);
  EXPECT_TRUE(read.metadata.empty());
  for (auto const& [name, t] : read.tensors) EXPECT_TRUE(t.device().is_cpu() && t.is_contiguous()) << name;
}

TEST(Safetensors, RoundTripsEmptyAndZeroDimTensors) {
  TempDir dir;
  TensorMap tensors;
  tensors["empty"] = at::empty({0}, at::kFloat);
  tensors["empty.middle"] = at::empty({3, 0, 2}, at::kBFloat16);
  tensors["scalar"] = at::scalar_tensor(2.5, at::kDouble);
  tensors["scalar.int"] = at::scalar_tensor(-7, at::kLong);
  tensors["after"] = at::arange(5, at::kInt);
  write_safetensors(dir.file("e.safetensors"), tensors);
  checkpoint::Safetensors const read = checkpoint::read_safetensors(dir.file("e.safetensors"));
  expect_same_tensors(tensors, read.tensors);
  EXPECT_EQ(read.tensors.at("scalar").dim(), 0);
  EXPECT_EQ(read.tensors.at("scalar").item<double>(), 2.5);
}

TEST(Safetensors, KeepsMetadataAlignsHeaderAndTensors) {
  TempDir dir;
  Metadata const metadata = {{"format", "pt"}, {"note", "quotes \" and \\ and unicode \xc3\xa9"}, {"empty", ""}};
  TensorMap tensors = every_dtype(test_seed());
  tensors["odd.f16"] = at::ones({3}, at::kHalf);  // 6 bytes: would misalign a wider tensor laid out after it
  write_safetensors(dir.file("m.safetensors"), tensors, metadata);
  EXPECT_EQ(checkpoint::read_safetensors(dir.file("m.safetensors")).metadata, metadata);

  checkpoint::SafetensorsHeader const header = checkpoint::read_safetensors_header(dir.file("m.safetensors"));
  EXPECT_EQ(header.data_start % 8, 0) << "header padded to 8 bytes";
  for (auto const& info : header.tensors) {
    EXPECT_EQ((header.data_start + info.begin) % static_cast<std::int64_t>(c10::elementSize(info.dtype)), 0)
        << info.name << " starts unaligned for its element size";
  }
  std::string const text = read_text(dir.file("m.safetensors")).substr(8, header.data_start - 8);
  EXPECT_EQ(text.front(), '{');
  EXPECT_EQ(text.find_last_not_of(' '), text.rfind('}')) << "padding is spaces after the JSON object";
}

TEST(Safetensors, WritesViewsAsContiguousCopies) {
  TempDir dir;
  at::Tensor const base = at::arange(24, at::kDouble).reshape({4, 6});
  TensorMap tensors;
  tensors["transposed"] = base.t();
  tensors["slice"] = base.narrow(1, 2, 3);
  tensors["strided"] = base.select(1, 4);
  write_safetensors(dir.file("v.safetensors"), tensors);
  TensorMap const read = checkpoint::read_safetensors(dir.file("v.safetensors")).tensors;
  for (auto const& [name, t] : tensors) EXPECT_TRUE(bitwise_equal(t.contiguous(), read.at(name))) << name;
}

TEST(Safetensors, ReadsOnlyWhatTheFilterKeepsAndAsksOncePerName) {
  TempDir dir;
  TensorMap const tensors = every_dtype(test_seed());
  write_safetensors(dir.file("f.safetensors"), tensors);
  std::multiset<std::string> asked;
  TensorMap const read = checkpoint::read_safetensors(dir.file("f.safetensors"), [&](std::string const& name) {
                           asked.insert(name);
                           return name.rfind("i", 0) == 0;
                         }).tensors;
  EXPECT_EQ(asked.size(), tensors.size());
  for (auto const& [name, t] : tensors) EXPECT_EQ(asked.count(name), 1u) << name;
  std::set<std::string> kept;
  for (auto const& entry : read) kept.insert(entry.first);
  EXPECT_EQ(kept, (std::set<std::string>{"i16", "i32", "i64", "i8"}));
}

TEST(Checkpoint, WritesOneFileWhenTheTensorsFitAndShardsOtherwise) {
  TempDir dir;
  TensorMap const tensors = every_dtype(test_seed());  // largest: 65536 × 2 bytes each for bf16 and f16
  std::int64_t total = 0;
  for (auto const& [name, t] : tensors) total += t.numel() * static_cast<std::int64_t>(t.element_size());

  std::vector<std::string> files = write_checkpoint(dir.path(), tensors, total);
  EXPECT_EQ(files, (std::vector<std::string>{checkpoint::kSingleFile}));
  expect_same_tensors(tensors, checkpoint::read_checkpoint(dir.path()).tensors);
  EXPECT_EQ(checkpoint::read_checkpoint(dir.path()).metadata, (Metadata{{"format", "pt"}}));

  files = write_checkpoint(dir.path(), tensors, 1000);  // the two 131072-byte tensors get shards of their own
  ASSERT_GE(files.size(), 4u);
  EXPECT_EQ(files.back(), checkpoint::kIndexFile);
  EXPECT_FALSE(exists(dir.file(checkpoint::kSingleFile))) << "the earlier single-file save is removed";
  EXPECT_EQ(files.front(), "model-00001-of-" + std::string(5 - std::to_string(files.size() - 1).size(), '0') +
                               std::to_string(files.size() - 1) + ".safetensors");
  json const index = json::parse(read_text(dir.file(checkpoint::kIndexFile)));
  EXPECT_EQ(index.at("metadata").at("total_size").get<std::int64_t>(), total);
  EXPECT_EQ(index.at("weight_map").size(), tensors.size());
  checkpoint::Safetensors const read = checkpoint::read_checkpoint(dir.path());
  expect_same_tensors(tensors, read.tensors);
  EXPECT_EQ(read.files.size(), files.size() - 1);
  EXPECT_EQ(read.metadata.at("total_size"), std::to_string(total));

  // A second sharded save with fewer shards leaves none of the first one's behind.
  std::size_t const shards_before = files.size() - 1;
  files = write_checkpoint(dir.path(), tensors, 140000);
  EXPECT_LT(files.size() - 1, shards_before);
  EXPECT_EQ(safetensors_files(dir.path()).size(), files.size() - 1);
  expect_same_tensors(tensors, checkpoint::read_checkpoint(dir.path()).tensors);

  // Filtered reads of a sharded folder.
  TensorMap const some = checkpoint::read_checkpoint(dir.path(), [](std::string const& n) { return n == "u8"; }).tensors;
  ASSERT_EQ(some.size(), 1u);
  EXPECT_TRUE(bitwise_equal(tensors.at("u8"), some.at("u8")));
}

TEST(Checkpoint, ReadsAFileOrAFolderHoldingOne) {
  TempDir dir;
  TensorMap tensors;
  tensors["w"] = at::arange(6, at::kFloat).reshape({2, 3});
  write_safetensors(dir.file(checkpoint::kSingleFile), tensors);
  expect_same_tensors(tensors, checkpoint::read_checkpoint(dir.path()).tensors);
  expect_same_tensors(tensors, checkpoint::read_checkpoint(dir.file(checkpoint::kSingleFile)).tensors);
}

// A corrupt file and the words its error must carry (besides the path, always checked).
struct Corruption {
  std::string name;
  std::string header;  // the JSON header as written
  std::string buffer;  // the data buffer
  std::vector<std::string> message;
  std::uint64_t header_len = std::numeric_limits<std::uint64_t>::max();  // default: header.size()
};

std::string f32s(int n) { return std::string(static_cast<std::size_t>(4 * n), '\0'); }

std::vector<Corruption> corruptions() {
  std::string const ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  return {
      {"HeaderLongerThanFile", "{" + ok_entry + "}", f32s(2), {"header length 1000000", "at most"}, 1000000},
      {"HeaderLengthNearUint64Max", "{" + ok_entry + "}", f32s(2), {"larger than the file allows"},
       std::numeric_limits<std::uint64_t>::max() - 1},
      {"HeaderNotJson", R"({"a":{"dtype":"F32",)", "", {"header is not valid JSON"}},
      {"HeaderNotAnObject", R"([1, 2])", "", {"must be a JSON object starting with '{'; got byte 91 ('[')"}},
      {"DuplicateName", "{" + ok_entry + "," + ok_entry + "}", f32s(2), {"has the key 'a' twice"}},
      {"EntryNotAnObject", R"({"a":[1]})", "", {"tensor 'a'", "entry must be an object"}},
      {"MissingDtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", f32s(2), {"tensor 'a'", "has no \"dtype\""}},
      {"DtypeNotAString", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", f32s(2),
       {"tensor 'a'", "dtype must be a string"}},
      {"UnknownDtype", R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0'),
       {"tensor 'a'", "unknown dtype \"F8_E4M3\"", "supported: F64"}},
      {"ShapeNotAnArray", R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", f32s(2),
       {"tensor 'a'", "shape must be an array"}},
      {"NegativeDimension", R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", f32s(2),
       {"tensor 'a'", "shape[1] must be a non-negative integer"}},
      {"FractionalDimension", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", f32s(2),
       {"tensor 'a'", "shape[0] must be a non-negative integer"}},
      {"OffsetsNotAPair", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", f32s(2),
       {"tensor 'a'", "data_offsets must be [begin, end]"}},
      {"OffsetsEndBeforeBegin", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f32s(2),
       {"tensor 'a'", "end before begin"}},
      {"OffsetsPastTheBuffer", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32s(2),
       {"tensor 'a'", "reach past the end of the data buffer", "expected end <= 8", "got 16"}},
      {"OffsetsNotShapeTimesDtype", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32s(2),
       {"tensor 'a'", "do not match shape [3] of F32", "expected 12 bytes, got 8"}},
      {"OverlappingOffsets",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       f32s(3), {"tensor 'b'", "overlap tensor 'a'", "expected begin 8, got 4"}},
      {"GapBetweenTensors",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       f32s(3), {"tensor 'b'", "leave bytes [4, 8)", "expected begin 4, got 8"}},
      {"TrailingBytes", "{" + ok_entry + "}", f32s(3), {"cover 8 bytes", "holds 12"}},
      {"MetadataNotStrings", R"({"__metadata__":{"step":3}})", "", {"__metadata__['step'] must be a string"}},
      {"BoolByteNotZeroOrOne", R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\1\2\0", 3),
       {"tensor 'm'", "BOOL element 1 is byte 2, expected 0 or 1"}},
  };
}

// One test for all cases (each process start loads LibTorch, about 2 s on the CI machine); SCOPED_TRACE names the case.
TEST(Safetensors, RejectsEveryCorruptionWithItsReason) {
  TempDir dir;
  for (Corruption const& c : corruptions()) {
    SCOPED_TRACE(c.name);
    std::string const path = dir.file(c.name + ".safetensors");
    write_raw(path, c.header, c.buffer, c.header_len);
    std::vector<std::string> parts = c.message;
    parts.push_back(path);
    expect_error([&] { checkpoint::read_safetensors(path); }, parts);
  }
}

TEST(Safetensors, RejectsMissingAndShortFiles) {
  TempDir dir;
  expect_error([&] { checkpoint::read_safetensors(dir.file("absent.safetensors")); },
               {dir.file("absent.safetensors"), "no such file"});
  std::ofstream(dir.file("short.safetensors"), std::ios::binary) << "abc";
  expect_error([&] { checkpoint::read_safetensors(dir.file("short.safetensors")); },
               {dir.file("short.safetensors"), "file is 3 bytes, shorter than the 8-byte header length"});
  expect_error([&] { checkpoint::read_checkpoint(dir.file("absent")); }, {dir.file("absent"), "no such file"});
  ::mkdir(dir.file("empty").c_str(), 0777);
  expect_error([&] { checkpoint::read_checkpoint(dir.file("empty")); },
               {dir.file("empty"), "holds neither model.safetensors.index.json nor model.safetensors"});
}

TEST(Safetensors, RejectsAHeaderOverTheSizeLimit) {
  TempDir dir;
  std::string const path = dir.file("huge.safetensors");
  write_raw(path, "{}", "", checkpoint::kMaxHeaderBytes + 1);
  ASSERT_EQ(::truncate(path.c_str(), checkpoint::kMaxHeaderBytes + 64), 0);  // sparse: no disk space used
  expect_error([&] { checkpoint::read_safetensors(path); },
               {path, "header length 100000001 exceeds the limit of 100000000 bytes"});
}

TEST(Safetensors, RejectsTensorsItCannotWrite) {
  TempDir dir;
  TensorMap complex;
  complex["c"] = at::zeros({2}, at::kComplexFloat);
  expect_error([&] { write_safetensors(dir.file("c.safetensors"), complex); },
               {"tensor 'c'", "ComplexFloat cannot be written"});
  TensorMap reserved;
  reserved["__metadata__"] = at::zeros({2});
  expect_error([&] { write_safetensors(dir.file("r.safetensors"), reserved); }, {"cannot be named '__metadata__'"});
  EXPECT_FALSE(exists(dir.file("c.safetensors")));
}

// A sharded folder of two shards (a, b in shard 1; c in shard 2) whose index `edit` then damages.
void expect_bad_index(std::function<void(json&)> const& edit, std::vector<std::string> const& message) {
  TempDir dir;
  TensorMap tensors;
  tensors["a"] = at::zeros({4}, at::kFloat);
  tensors["b"] = at::zeros({4}, at::kFloat);
  tensors["c"] = at::zeros({8}, at::kFloat);
  ASSERT_EQ(write_checkpoint(dir.path(), tensors, 32).size(), 3u);
  std::string const index_path = dir.file(checkpoint::kIndexFile);
  json index = json::parse(read_text(index_path));
  edit(index);
  std::ofstream(index_path) << index.dump();
  std::vector<std::string> parts = message;
  parts.push_back(index_path);
  expect_error([&] { checkpoint::read_checkpoint(dir.path()); }, parts);
}

TEST(Checkpoint, RejectsAnIndexNamingAMissingShard) {
  expect_bad_index([](json& index) { index["weight_map"]["c"] = "model-00009-of-00009.safetensors"; },
                   {"puts 1 tensors (e.g. 'c') in shard 'model-00009-of-00009.safetensors', which does not exist"});
}

TEST(Checkpoint, RejectsAnIndexNamingATensorItsShardLacks) {
  expect_bad_index([](json& index) { index["weight_map"]["z"] = "model-00002-of-00002.safetensors"; },
                   {"puts tensor 'z' in shard 'model-00002-of-00002.safetensors', which does not hold it"});
}

TEST(Checkpoint, RejectsAShardHoldingATensorTheIndexDoesNotList) {
  expect_bad_index([](json& index) { index["weight_map"].erase("b"); },
                   {"shard 'model-00001-of-00002.safetensors' holds tensor 'b', which weight_map does not list"});
  expect_bad_index([](json& index) { index["weight_map"]["b"] = "model-00002-of-00002.safetensors"; },
                   {"holds tensor 'b', which weight_map puts in shard 'model-00002-of-00002.safetensors'"});
}

TEST(Checkpoint, RejectsAMalformedIndex) {
  expect_bad_index([](json& index) { index.erase("weight_map"); }, {"needs \"weight_map\""});
  expect_bad_index([](json& index) { index["weight_map"]["a"] = 3; }, {"weight_map['a'] must be a shard file name"});
  expect_bad_index([](json& index) { index["weight_map"]["a"] = "../model-00001-of-00002.safetensors"; },
                   {"not the name of a file in the index's folder"});
  expect_bad_index([](json& index) { index = json::array(); }, {"must be a JSON object"});
}

TEST(CheckTensor, NamesTheTensorAndTheMismatch) {
  at::Tensor const t = at::zeros({2, 3}, at::kBFloat16);
  checkpoint::check_tensor("w", t, {2, 3}, at::kBFloat16);  // matches: no throw
  expect_error([&] { checkpoint::check_tensor("model.norm.weight", t, {3, 3}, at::kBFloat16); },
               {"tensor 'model.norm.weight': shape [2, 3] does not match the expected [3, 3]",
                "dimension 0: expected 3, got 2"});
  expect_error([&] { checkpoint::check_tensor("w", t, {6}, at::kBFloat16); }, {"expected 1 dimensions, got 2"});
  expect_error([&] { checkpoint::check_tensor("w", t, {2, 3}, at::kFloat); },
               {"tensor 'w': dtype BFloat16 does not match the expected Float"});
  expect_error([&] { checkpoint::check_tensor("w", at::Tensor(), {2, 3}, at::kFloat); }, {"tensor 'w': is missing"});
}

TEST(Qwen35Names, MapsTheLanguageModelPrefixAndSkipsVisualAndMtp) {
  using checkpoint::Qwen35Part;
  auto const text = [](std::string const& name) {
    checkpoint::Qwen35Name const m = checkpoint::qwen35_text_name(name);
    return m.part == Qwen35Part::kText ? m.name : std::string("<skipped>");
  };
  EXPECT_EQ(text("model.language_model.layers.0.linear_attn.in_proj_qkv.weight"),
            "model.layers.0.linear_attn.in_proj_qkv.weight");
  EXPECT_EQ(text("model.language_model.embed_tokens.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(text("model.language_model.norm.weight"), "model.norm.weight");
  EXPECT_EQ(text("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(text("model.layers.3.self_attn.q_proj.weight"), "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(checkpoint::qwen35_text_name("model.visual.blocks.0.attn.qkv.weight").part, Qwen35Part::kVisual);
  EXPECT_EQ(checkpoint::qwen35_text_name("mtp.layers.0.mlp.up_proj.weight").part, Qwen35Part::kMtp);
  EXPECT_EQ(text("model.visualizer.weight"), "model.visualizer.weight") << "only the model.visual. prefix is skipped";
}

TEST(Qwen35Names, ReadsAVlmCheckpointAsTheTextModel) {
  TempDir dir;
  TensorMap tensors;
  tensors["model.language_model.embed_tokens.weight"] = at::arange(12, at::kFloat).reshape({4, 3});
  tensors["model.language_model.layers.0.input_layernorm.weight"] = at::ones({3}, at::kFloat);
  tensors["model.language_model.norm.weight"] = at::zeros({3}, at::kFloat);
  tensors["lm_head.weight"] = at::ones({4, 3}, at::kFloat);
  tensors["model.visual.patch_embed.proj.weight"] = at::ones({2, 2}, at::kFloat);
  tensors["model.visual.merger.linear_fc1.weight"] = at::ones({2, 2}, at::kFloat);
  tensors["mtp.fc.weight"] = at::ones({3, 6}, at::kFloat);
  write_checkpoint(dir.path(), tensors, 64);  // sharded, so the mapping runs through the index path
  checkpoint::Qwen35TextCheckpoint const read = checkpoint::read_qwen35_text_checkpoint(dir.path());
  std::set<std::string> names;
  for (auto const& entry : read.tensors) names.insert(entry.first);
  EXPECT_EQ(names, (std::set<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                          "model.layers.0.input_layernorm.weight", "model.norm.weight"}));
  EXPECT_EQ(read.skipped_visual, 2);
  EXPECT_EQ(read.skipped_mtp, 1);
  EXPECT_TRUE(bitwise_equal(read.tensors.at("model.embed_tokens.weight"),
                            tensors.at("model.language_model.embed_tokens.weight")));
}

TEST(Qwen35Names, RejectsTwoNamesForOneTextTensor) {
  TempDir dir;
  TensorMap tensors;
  tensors["model.language_model.norm.weight"] = at::zeros({3}, at::kFloat);
  tensors["model.norm.weight"] = at::zeros({3}, at::kFloat);
  write_safetensors(dir.file("both.safetensors"), tensors);
  expect_error([&] { checkpoint::read_qwen35_text_checkpoint(dir.file("both.safetensors")); },
               {"'model.language_model.norm.weight' and 'model.norm.weight' both map to the text model's "
                "'model.norm.weight'"});
}

// golden/hf/qwen35-tiny: model.safetensors written by transformers' save_pretrained (the Python safetensors
// library); golden.json lists each tensor's shape, dtype and fp64 sum as Python read them.
TEST(HfGolden, ModelSafetensorsFromPythonParsesWithTheRecordedNamesShapesAndSums) {
  std::string const dir = FUSEPACK_HF_GOLDEN_DIR;
  json const golden = json::parse(read_text(dir + "/golden.json"));
  json const& params = golden.at("model").at("parameters");
  checkpoint::Safetensors const read = checkpoint::read_checkpoint(dir);
  EXPECT_EQ(read.metadata, (Metadata{{"format", "pt"}}));
  ASSERT_EQ(read.tensors.size(), params.size());
  for (auto const& [name, p] : params.items()) {
    auto const it = read.tensors.find(name);
    ASSERT_NE(it, read.tensors.end()) << name;
    EXPECT_EQ(checkpoint::safetensors_dtype_name(it->second.scalar_type()), p.at("dtype").get<std::string>());
    EXPECT_EQ(it->second.sizes().vec(), p.at("shape").get<std::vector<std::int64_t>>()) << name;
    // torch sums the same fp64 values in the same order on both sides; 1e-12 relative leaves room for a different
    // reduction order (vectorised vs not) while a wrong byte or a wrong offset changes the sum at 1e-3 or more.
    double const expected = p.at("sum").get<double>(), got = it->second.sum().item<double>();
    EXPECT_LE(std::abs(got - expected), 1e-12 * std::max(1.0, std::abs(expected))) << name;
  }
  // The names Hugging Face gives Qwen3_5ForCausalLM: text-model form, linear_attn in layers 0-2, self_attn in 3.
  for (std::string const name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                                 "model.layers.0.linear_attn.in_proj_qkv.weight", "model.layers.2.linear_attn.A_log",
                                 "model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.k_norm.weight",
                                 "model.layers.1.linear_attn.conv1d.weight", "model.layers.0.mlp.down_proj.weight"}) {
    EXPECT_EQ(read.tensors.count(name), 1u) << name;
  }
  EXPECT_EQ(read.tensors.at("model.layers.0.linear_attn.conv1d.weight").sizes().vec(),
            (std::vector<std::int64_t>{128, 1, 4}));

  // Written back by fusepack (sharded) and read again: the same bits.
  TempDir out;
  write_checkpoint(out.path(), read.tensors, 200000);
  expect_same_tensors(read.tensors, checkpoint::read_checkpoint(out.path()).tensors);
}

}  // namespace
}  // namespace fusepack::test
