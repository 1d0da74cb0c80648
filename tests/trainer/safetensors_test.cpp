// Checkpoint I/O (trainer/checkpoint): safetensors round trips of every dtype bit for bit, sharded folders, every kind
// of corrupt file or index rejected with its reason, row reads that touch only their rows' bytes, the streaming writer
// byte for byte against write_checkpoint's layout, the Qwen3.5 name mapping, and the Hugging Face golden's
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
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fusepack::test {
namespace {

using checkpoint::CheckpointWriter;
using checkpoint::Metadata;
using checkpoint::TensorEntry;
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

// The names in `dir`, without "." and "..".
std::set<std::string> files_in(std::string const& dir) {
  std::set<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  while (dirent const* e = d != nullptr ? ::readdir(d) : nullptr) {
    std::string const name = e->d_name;
    if (name != "." && name != "..") names.insert(name);
  }
  if (d != nullptr) ::closedir(d);
  return names;
}

std::vector<std::string> safetensors_files(std::string const& dir) {
  std::vector<std::string> names;
  for (std::string const& name : files_in(dir)) {
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) names.push_back(name);
  }
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

// `statement` must throw `Error` whose message contains every one of `parts`; the message is printed so the log shows
// what a user would see.
template <typename Error = std::runtime_error>
void expect_error(std::function<void()> const& statement, std::vector<std::string> const& parts) {
  try {
    statement();
    ADD_FAILURE() << "expected " << (std::is_same_v<Error, std::runtime_error> ? "std::runtime_error" : "an error")
                  << " containing '" << parts.front() << "'";
  } catch (Error const& e) {
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

// The message of the std::exception `statement` throws; empty when it throws none.
std::string error_of(std::function<void()> const& statement) {
  try {
    statement();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "";
}

std::string read_text(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(std::string const& path, std::string const& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Every file of `dir`, name → bytes.
std::map<std::string, std::string> folder_bytes(std::string const& dir) {
  std::map<std::string, std::string> bytes;
  for (std::string const& name : files_in(dir)) bytes[name] = read_text(dir + "/" + name);
  return bytes;
}

std::vector<TensorEntry> entries_of(TensorMap const& tensors) {
  std::vector<TensorEntry> entries;
  for (auto const& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  return entries;
}

// The first `count` tensors of the writer's write_order().
void write_first(CheckpointWriter& writer, TensorMap const& tensors, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) writer.write(writer.write_order()[i], tensors.at(writer.write_order()[i]));
}

void write_all(CheckpointWriter& writer, TensorMap const& tensors) {
  write_first(writer, tensors, writer.write_order().size());
}

// Every row range [begin, end) of a tensor of `rows` rows, the empty ones included.
void for_each_row_range(std::int64_t rows, std::function<void(std::int64_t begin, std::int64_t end)> const& check) {
  for (std::int64_t begin = 0; begin <= rows; ++begin) {
    for (std::int64_t end = begin; end <= rows; ++end) check(begin, end);
  }
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

// A sharded folder of two shards (a, b in shard 1; c in shard 2) whose index `edit` then damages: read_checkpoint
// refuses it with `message`, index_checkpoint with the same words.
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
  std::string const read_error = error_of([&] { checkpoint::read_checkpoint(dir.path()); });
  expect_error([&] { checkpoint::read_checkpoint(dir.path()); }, parts);
  EXPECT_EQ(error_of([&] { checkpoint::index_checkpoint(dir.path()); }), read_error)
      << "index_checkpoint refuses the index as read_checkpoint does";
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

TEST(IndexCheckpoint, RefusesEveryCorruptFileAsReadCheckpointDoes) {
  TempDir dir;
  for (Corruption const& c : corruptions()) {
    SCOPED_TRACE(c.name);
    std::string const path = dir.file(c.name + ".safetensors");
    write_raw(path, c.header, c.buffer, c.header_len);
    std::string const read_error = error_of([&] { checkpoint::read_checkpoint(path); });
    ASSERT_FALSE(read_error.empty());
    if (c.name == "BoolByteNotZeroOrOne") {
      // Tensor bytes are not the index's to read: read_rows refuses them, with read_checkpoint's words.
      checkpoint::CheckpointIndex const index = checkpoint::index_checkpoint(path);
      EXPECT_EQ(error_of([&] { checkpoint::read_rows(index.tensors.at("m"), 0, 3); }), read_error);
    } else {
      EXPECT_EQ(error_of([&] { checkpoint::index_checkpoint(path); }), read_error);
    }
  }
  for (std::string const& missing : {dir.file("absent.safetensors"), dir.file("absent")}) {
    EXPECT_EQ(error_of([&] { checkpoint::index_checkpoint(missing); }),
              error_of([&] { checkpoint::read_checkpoint(missing); }));
  }
  ::mkdir(dir.file("empty").c_str(), 0777);
  expect_error([&] { checkpoint::index_checkpoint(dir.file("empty")); },
               {dir.file("empty"), "holds neither model.safetensors.index.json nor model.safetensors"});
}

// Tensors with rows of several dtypes and shapes (1-D, 3-D, no rows, empty rows) and a 0-dim one, which has none.
TensorMap row_tensors(std::uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  TensorMap t;
  t["a.f32"] = at::randn({5, 3}, gen, at::kFloat);
  t["b.bf16"] = at::randn({4, 2, 2}, gen, at::kFloat).to(at::kBFloat16);
  t["c.i64"] = at::randint(-1000, 1000, {7}, gen, at::kLong);
  t["d.bool"] = at::randint(0, 2, {6, 2}, gen, at::kLong).to(at::kBool);
  t["e.u8"] = at::arange(3, at::kInt).to(at::kByte).reshape({3, 1});
  t["f.f64"] = at::randn({2, 3}, gen, at::kDouble);
  t["g.no_rows"] = at::empty({0, 4}, at::kFloat);
  t["h.empty_rows"] = at::empty({3, 0}, at::kHalf);
  t["i.i8"] = at::arange(-9, 9, at::kInt).to(at::kChar).reshape({9, 2});
  t["z.scalar"] = at::scalar_tensor(1.5, at::kDouble);
  return t;
}

// The three forms a checkpoint path takes; the test reads rows through each.
class ReadRowsFrom : public ::testing::TestWithParam<std::string> {
 protected:
  // Writes `tensors` in this test's form; returns the path to hand to index_checkpoint.
  std::string write(TempDir const& dir, TensorMap const& tensors) {
    if (GetParam() == "file") {
      write_safetensors(dir.file("rows.safetensors"), tensors);
      return dir.file("rows.safetensors");
    }
    std::vector<std::string> const files = write_checkpoint(dir.path(), tensors, GetParam() == "sharded" ? 40 : 0);
    EXPECT_EQ(files.size() > 1, GetParam() == "sharded");
    return dir.path();
  }
};

TEST_P(ReadRowsFrom, EveryRangeEqualsTheSliceOfReadCheckpoint) {
  TempDir dir;
  std::string const path = write(dir, row_tensors(test_seed()));
  checkpoint::Safetensors const whole = checkpoint::read_checkpoint(path);
  checkpoint::CheckpointIndex const index = checkpoint::index_checkpoint(path);
  EXPECT_EQ(index.files, whole.files);
  EXPECT_EQ(index.metadata, whole.metadata);
  ASSERT_EQ(index.tensors.size(), whole.tensors.size());
  for (auto const& [name, t] : whole.tensors) {
    checkpoint::TensorLocation const& where = index.tensors.at(name);
    EXPECT_EQ(where.info.name, name);
    EXPECT_EQ(where.info.dtype, t.scalar_type()) << name;
    EXPECT_EQ(where.info.shape, t.sizes().vec()) << name;
    if (t.dim() == 0) continue;
    for_each_row_range(t.size(0), [&](std::int64_t begin, std::int64_t end) {
      at::Tensor const rows = checkpoint::read_rows(where, begin, end);
      EXPECT_TRUE(rows.device().is_cpu() && rows.is_contiguous()) << name;
      EXPECT_TRUE(bitwise_equal(rows, t.narrow(0, begin, end - begin)))
          << name << " rows [" << begin << ", " << end << ")";
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, ReadRowsFrom, ::testing::Values("file", "folder", "sharded"),
                         [](::testing::TestParamInfo<std::string> const& p) { return p.param; });

TEST(ReadRows, ReadsOnlyTheBytesOfItsRows) {
  TempDir dir;
  TensorMap tensors;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(test_seed());
  tensors["w"] = at::randn({5, 3}, gen, at::kFloat);
  tensors["m"] = at::randint(0, 2, {4, 3}, gen, at::kLong).to(at::kBool);
  tensors["v"] = at::randint(-1000, 1000, {6}, gen, at::kLong);
  std::string const path = dir.file("w.safetensors");
  write_safetensors(path, tensors);
  std::string const original = read_text(path);
  checkpoint::CheckpointIndex const index = checkpoint::index_checkpoint(path);
  for (auto const& [name, t] : tensors) {
    checkpoint::TensorLocation const& where = index.tensors.at(name);
    std::int64_t const row_bytes = (where.info.end - where.info.begin) / t.size(0);
    for_each_row_range(t.size(0), [&](std::int64_t begin, std::int64_t end) {
      // Every byte of the file but the rows' own, header included, becomes 0xA5: not a BOOL byte, not a header.
      std::size_t const from = static_cast<std::size_t>(where.data_start + where.info.begin + begin * row_bytes);
      std::size_t const size = static_cast<std::size_t>((end - begin) * row_bytes);
      std::string corrupt(original.size(), '\xa5');
      corrupt.replace(from, size, original, from, size);
      write_text(path, corrupt);
      EXPECT_TRUE(bitwise_equal(checkpoint::read_rows(where, begin, end), t.narrow(0, begin, end - begin)))
          << name << " rows [" << begin << ", " << end << ")";
    });
  }
  EXPECT_THROW(checkpoint::read_checkpoint(path), std::runtime_error) << "the file really is corrupt";
}

TEST(ReadRows, RefusesABoolByteOtherThanZeroOrOneInItsRows) {
  TempDir dir;
  std::string const path = dir.file("m.safetensors");
  write_raw(path, R"({"m":{"dtype":"BOOL","shape":[3,2],"data_offsets":[0,6]}})", std::string("\1\0\1\2\0\1", 6));
  checkpoint::TensorLocation const where = checkpoint::index_checkpoint(path).tensors.at("m");
  auto const bools = [](std::vector<std::int64_t> const& v) {
    return at::tensor(v, at::kLong).to(at::kBool).reshape({1, 2});
  };
  EXPECT_TRUE(bitwise_equal(checkpoint::read_rows(where, 0, 1), bools({1, 0})));
  EXPECT_TRUE(bitwise_equal(checkpoint::read_rows(where, 2, 3), bools({0, 1})));
  expect_error([&] { checkpoint::read_rows(where, 1, 3); },
               {path, "tensor 'm'", "BOOL element 3 is byte 2, expected 0 or 1"});
}

TEST(ReadRows, RefusesARangeOutsideTheTensorNamingTensorRangeAndShape) {
  TempDir dir;
  TensorMap tensors;
  tensors["w"] = at::zeros({4, 3}, at::kFloat);
  tensors["s"] = at::scalar_tensor(1.0, at::kFloat);
  std::string const path = dir.file("r.safetensors");
  write_safetensors(path, tensors);
  checkpoint::CheckpointIndex const index = checkpoint::index_checkpoint(path);
  checkpoint::TensorLocation const& w = index.tensors.at("w");
  for (auto const& [begin, end] : std::vector<std::pair<std::int64_t, std::int64_t>>{{-1, 2}, {3, 2}, {0, 5}, {5, 5}}) {
    expect_error<std::invalid_argument>(
        [&] { checkpoint::read_rows(w, begin, end); },
        {path, "tensor 'w'", "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ")",
         "are not a range of dim 0 of shape [4, 3]", "expected 0 <= row_begin <= row_end <= 4"});
  }
  expect_error<std::invalid_argument>([&] { checkpoint::read_rows(index.tensors.at("s"), 0, 0); },
                                      {path, "tensor 's'", "rows [0, 0)", "0-dim (shape [])", "has no rows"});
}

// The layout every fusepack checkpoint has had (these bytes were written before the streaming writer existed): the
// header's metadata first, then the tensors widest element first and by name, padded by spaces to 8 bytes; shards
// filled in name order; the index sorted, indented by 2, ending in a newline.
TensorMap layout_tensors() {
  TensorMap t;
  t["after"] = at::arange(5, at::kInt);
  t["empty"] = at::empty({0}, at::kFloat);
  t["empty.middle"] = at::empty({3, 0, 2}, at::kBFloat16);
  t["odd"] = at::ones({3}, at::kHalf);
  t["scalar"] = at::scalar_tensor(2.5, at::kDouble);
  return t;
}

std::string safetensors_bytes(std::string const& header, std::vector<at::Tensor> const& buffer) {
  std::string bytes;
  for (std::uint64_t n = header.size(), i = 0; i < 8; ++i, n >>= 8) bytes += static_cast<char>(n & 0xff);
  bytes += header;
  for (at::Tensor const& t : buffer) {
    bytes.append(static_cast<char const*>(t.data_ptr()), static_cast<std::size_t>(t.numel()) * t.element_size());
  }
  return bytes;
}

TEST(CheckpointWriter, WritesTheLayoutWriteCheckpointAlwaysWrote) {
  TensorMap const t = layout_tensors();
  std::map<std::string, std::string> const single = {
      {"model.safetensors",
       safetensors_bytes(R"({"__metadata__":{"format":"pt"},"scalar":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                         R"("after":{"dtype":"I32","shape":[5],"data_offsets":[8,28]},)"
                         R"("empty":{"dtype":"F32","shape":[0],"data_offsets":[28,28]},)"
                         R"("empty.middle":{"dtype":"BF16","shape":[3,0,2],"data_offsets":[28,28]},)"
                         R"("odd":{"dtype":"F16","shape":[3],"data_offsets":[28,34]}}  )",
                         {t.at("scalar"), t.at("after"), t.at("odd")})}};
  // 8-byte shards: "after" (20 bytes) alone, then the empty tensors and "odd" (6 bytes), then "scalar" (8 bytes).
  std::string const index = R"({
  "metadata": {
    "total_size": 34
  },
  "weight_map": {
    "after": "model-00001-of-00003.safetensors",
    "empty": "model-00002-of-00003.safetensors",
    "empty.middle": "model-00002-of-00003.safetensors",
    "odd": "model-00002-of-00003.safetensors",
    "scalar": "model-00003-of-00003.safetensors"
  }
}
)";
  std::string const shard1 = safetensors_bytes(
      R"({"__metadata__":{"format":"pt"},"after":{"dtype":"I32","shape":[5],"data_offsets":[0,20]}}      )",
      {t.at("after")});

  TempDir a, b;
  write_checkpoint(a.path(), t);
  EXPECT_EQ(folder_bytes(a.path()), single);
  CheckpointWriter writer(b.path(), entries_of(t));
  write_all(writer, t);
  writer.finish();
  EXPECT_EQ(folder_bytes(b.path()), single);

  write_checkpoint(a.path(), t, 8);
  CheckpointWriter sharded(b.path(), entries_of(t), 8);
  write_all(sharded, t);
  sharded.finish();
  for (TempDir const* dir : {&a, &b}) {
    std::map<std::string, std::string> const got = folder_bytes(dir->path());
    EXPECT_EQ(got.size(), 4u);
    EXPECT_EQ(got.at("model.safetensors.index.json"), index);
    EXPECT_EQ(got.at("model-00001-of-00003.safetensors"), shard1);
  }
  EXPECT_EQ(folder_bytes(a.path()), folder_bytes(b.path()));
}

TEST(CheckpointWriter, WritesTheBytesOfWriteCheckpointFromTensorsInAnyOrderAndLayout) {
  TensorMap const tensors = every_dtype(test_seed());
  // The same values as views: transposed back and forth (non-contiguous), entries listed in reverse.
  TensorMap views;
  std::vector<TensorEntry> entries = entries_of(tensors);
  std::reverse(entries.begin(), entries.end());
  for (auto const& [name, t] : tensors) views[name] = t.dim() < 2 ? t : t.transpose(0, 1).contiguous().transpose(0, 1);
  EXPECT_FALSE(views.at("f32").is_contiguous());
  for (std::int64_t const max_shard_bytes : {0, 1000, 140000}) {
    SCOPED_TRACE("max_shard_bytes " + std::to_string(max_shard_bytes));
    TempDir a, b;
    std::vector<std::string> const expected_files = write_checkpoint(a.path(), tensors, max_shard_bytes);
    CheckpointWriter writer(b.path(), entries, max_shard_bytes);
    write_all(writer, views);
    EXPECT_EQ(writer.finish(), expected_files);
    std::map<std::string, std::string> const expected = folder_bytes(a.path()), got = folder_bytes(b.path());
    EXPECT_EQ(expected.size(), expected_files.size());
    ASSERT_EQ(got.size(), expected.size());
    for (auto const& [name, bytes] : expected) EXPECT_TRUE(got.at(name) == bytes) << name << " differs";
  }
}

TEST(CheckpointWriter, AsksForTheTensorsFileByFileInBufferOrder) {
  TempDir dir;
  CheckpointWriter writer(dir.path(), entries_of(layout_tensors()), 8);
  EXPECT_EQ(writer.write_order(),
            (std::vector<std::string>{"after", "empty", "empty.middle", "odd", "scalar"}));
  TempDir one;
  EXPECT_EQ(CheckpointWriter(one.path(), entries_of(layout_tensors())).write_order(),
            (std::vector<std::string>{"scalar", "after", "empty", "empty.middle", "odd"}));
}

TEST(CheckpointWriter, RefusesATensorOutOfOrderAndStaysUsable) {
  TempDir dir;
  TensorMap const t = layout_tensors();
  CheckpointWriter writer(dir.path(), entries_of(t));
  expect_error([&] { writer.write("after", t.at("after")); },
               {dir.path(), "write() got tensor 'after', expected 'scalar' (tensor 1 of 5 in write_order())"});
  expect_error([&] { writer.write("bias", t.at("after")); },
               {"got tensor 'bias', expected 'scalar'", "not in the plan"});
  write_all(writer, t);
  expect_error([&] { writer.write("odd", t.at("odd")); },
               {"got tensor 'odd' after all 5 planned tensors were written"});
  writer.finish();
  expect_same_tensors(t, checkpoint::read_checkpoint(dir.path()).tensors);
  expect_error([&] { writer.write("odd", t.at("odd")); }, {"write('odd') after finish()"});
}

TEST(CheckpointWriter, RefusesAShapeOrDtypeOtherThanPlanned) {
  TempDir dir;
  TensorMap t;
  t["w"] = at::zeros({3, 3}, at::kBFloat16);
  CheckpointWriter writer(dir.path(), entries_of(t));
  expect_error([&] { writer.write("w", at::zeros({2, 3}, at::kBFloat16)); },
               {dir.path(), "tensor 'w': shape [2, 3] does not match the expected [3, 3]",
                "dimension 0: expected 3, got 2"});
  expect_error([&] { writer.write("w", at::zeros({3, 3}, at::kFloat)); },
               {"tensor 'w': dtype Float does not match the expected BFloat16"});
  expect_error([&] { writer.write("w", at::Tensor()); }, {"tensor 'w': is missing"});
  writer.write("w", t.at("w"));
  writer.finish();
  expect_same_tensors(t, checkpoint::read_checkpoint(dir.path()).tensors);
}

TEST(CheckpointWriter, RefusesEntriesNoSafetensorsFileHolds) {
  TempDir dir;
  std::string const where = "checkpoint " + dir.path();
  expect_error([&] { CheckpointWriter(dir.path(), {{"w", at::kFloat, {2}}, {"w", at::kFloat, {2}}}); },
               {where, "tensor 'w' is planned twice"});
  expect_error([&] { CheckpointWriter(dir.path(), {{"c", at::kComplexFloat, {2}}}); },
               {where, "tensor 'c'", "dtype ComplexFloat cannot be written"});
  expect_error([&] { CheckpointWriter(dir.path(), {{"w", at::kFloat, {2, -1}}}); },
               {where, "tensor 'w'", "shape [2, -1] has a negative dimension"});
  expect_error([&] { CheckpointWriter(dir.path(), {{"__metadata__", at::kFloat, {2}}}); },
               {where, "cannot be named '__metadata__'"});
  expect_error<std::invalid_argument>([&] { CheckpointWriter(dir.path(), {}, -1); },
                                      {where, "max_shard_bytes must be >= 0", "got -1"});
  EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(CheckpointWriter, FinishWithATensorMissingSavesNothingAndKeepsTheEarlierSave) {
  TempDir dir;
  TensorMap const earlier = layout_tensors();
  write_checkpoint(dir.path(), earlier);
  TensorMap const t = every_dtype(test_seed());
  CheckpointWriter writer(dir.path(), entries_of(t), 1000);
  std::string const missing = writer.write_order()[6];
  write_first(writer, t, 6);
  expect_error([&] { writer.finish(); },
               {dir.path(), "finish() before tensor '" + missing + "' was written (6 of 10 tensors written)"});
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"model.safetensors"})) << "no shard, no index, no .tmp";
  expect_same_tensors(earlier, checkpoint::read_checkpoint(dir.path()).tensors);
}

TEST(CheckpointWriter, DestroyedBeforeFinishRemovesItsTmpFiles) {
  TempDir dir;
  TensorMap const t = every_dtype(test_seed());
  {
    CheckpointWriter writer(dir.path(), entries_of(t), 1000);
    write_first(writer, t, 6);
    std::set<std::string> const during = files_in(dir.path());
    EXPECT_GE(during.size(), 2u) << "finished shards and the one being written";
    for (std::string const& name : during) {
      EXPECT_EQ(name.substr(name.size() - 4), ".tmp") << name << " is at its final name before finish()";
    }
  }
  EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(CheckpointWriter, RemovesTheStaleFilesOfAnEarlierSave) {
  TempDir dir;
  TensorMap const t = every_dtype(test_seed());
  write_checkpoint(dir.path(), t, 1000);
  write_text(dir.file("config.json"), "{}");
  ASSERT_GT(safetensors_files(dir.path()).size(), 3u);
  for (std::int64_t const max_shard_bytes : {140000, 0}) {
    CheckpointWriter writer(dir.path(), entries_of(t), max_shard_bytes);
    write_all(writer, t);
    std::vector<std::string> written = writer.finish();
    written.push_back("config.json");  // not a checkpoint file: kept
    EXPECT_EQ(files_in(dir.path()), std::set<std::string>(written.begin(), written.end()));
    expect_same_tensors(t, checkpoint::read_checkpoint(dir.path()).tensors);
  }
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

// A VLM checkpoint: the text model under model.language_model., two vision tensors, one multi-token-prediction one.
TensorMap vlm_tensors() {
  TensorMap tensors;
  tensors["model.language_model.embed_tokens.weight"] = at::arange(12, at::kFloat).reshape({4, 3});
  tensors["model.language_model.layers.0.input_layernorm.weight"] = at::ones({3}, at::kFloat);
  tensors["model.language_model.norm.weight"] = at::zeros({3}, at::kFloat);
  tensors["lm_head.weight"] = at::ones({4, 3}, at::kFloat);
  tensors["model.visual.patch_embed.proj.weight"] = at::ones({2, 2}, at::kFloat);
  tensors["model.visual.merger.linear_fc1.weight"] = at::ones({2, 2}, at::kFloat);
  tensors["mtp.fc.weight"] = at::ones({3, 6}, at::kFloat);
  return tensors;
}

std::set<std::string> const kVlmTextNames = {"lm_head.weight", "model.embed_tokens.weight",
                                             "model.layers.0.input_layernorm.weight", "model.norm.weight"};

TEST(Qwen35Names, ReadsAVlmCheckpointAsTheTextModel) {
  TempDir dir;
  TensorMap const tensors = vlm_tensors();
  write_checkpoint(dir.path(), tensors, 64);  // sharded, so the mapping runs through the index path
  checkpoint::Qwen35TextCheckpoint const read = checkpoint::read_qwen35_text_checkpoint(dir.path());
  std::set<std::string> names;
  for (auto const& entry : read.tensors) names.insert(entry.first);
  EXPECT_EQ(names, kVlmTextNames);
  EXPECT_EQ(read.skipped_visual, 2);
  EXPECT_EQ(read.skipped_mtp, 1);
  EXPECT_TRUE(bitwise_equal(read.tensors.at("model.embed_tokens.weight"),
                            tensors.at("model.language_model.embed_tokens.weight")));
}

TEST(Qwen35Names, IndexesAVlmCheckpointAsTheTextModel) {
  TempDir dir;
  TensorMap const tensors = vlm_tensors();
  write_checkpoint(dir.path(), tensors, 64);
  checkpoint::Qwen35TextIndex const index = checkpoint::index_qwen35_text_checkpoint(dir.path());
  std::set<std::string> names;
  for (auto const& entry : index.tensors) names.insert(entry.first);
  EXPECT_EQ(names, kVlmTextNames);
  EXPECT_EQ(index.skipped_visual, 2);
  EXPECT_EQ(index.skipped_mtp, 1);
  checkpoint::Qwen35TextCheckpoint const read = checkpoint::read_qwen35_text_checkpoint(dir.path());
  EXPECT_EQ(index.files, read.files);
  EXPECT_EQ(index.metadata, read.metadata);
  checkpoint::TensorLocation const& embed = index.tensors.at("model.embed_tokens.weight");
  EXPECT_EQ(embed.info.name, "model.language_model.embed_tokens.weight") << "the location keeps the file's name";
  EXPECT_TRUE(bitwise_equal(checkpoint::read_rows(embed, 1, 3),
                            tensors.at("model.language_model.embed_tokens.weight").narrow(0, 1, 2)));
}

TEST(Qwen35Names, RejectsTwoNamesForOneTextTensor) {
  TempDir dir;
  TensorMap tensors;
  tensors["model.language_model.norm.weight"] = at::zeros({3}, at::kFloat);
  tensors["model.norm.weight"] = at::zeros({3}, at::kFloat);
  write_safetensors(dir.file("both.safetensors"), tensors);
  std::vector<std::string> const message = {
      dir.file("both.safetensors"),
      "'model.language_model.norm.weight' and 'model.norm.weight' both map to the text model's 'model.norm.weight'"};
  expect_error([&] { checkpoint::read_qwen35_text_checkpoint(dir.file("both.safetensors")); }, message);
  expect_error([&] { checkpoint::index_qwen35_text_checkpoint(dir.file("both.safetensors")); }, message);
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
