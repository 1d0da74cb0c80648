// JSONL datasets: the HF convention read and written back, streaming, and every bad input named by file, line and
// field. The progress lines of long phases (packing/progress.h), which a large file's read prints: at most one per
// interval, nothing for a phase shorter than it, on a clock the test moves by hand.
#include "packing/dataset.h"
#include "packing/progress.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

namespace fusepack::test {
namespace {

using packing::DatasetError;
using packing::Example;
using packing::kIgnoreIndex;

constexpr std::int64_t kVocab = 100;

// A file under the temp directory, named after the running test, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(std::string const& contents) {
    auto const* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() / ("fusepack_" + std::string(info->test_suite_name()) + "_" +
                                                       info->name() + "_" + std::to_string(::getpid()) + ".jsonl"))
                .string();
    std::ofstream(path_) << contents;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(TempFile const&) = delete;
  TempFile& operator=(TempFile const&) = delete;
  std::string const& path() const { return path_; }

 private:
  std::string path_;
};

// `statement` must throw DatasetError naming `file`, `line` and `field`, whose message contains `substring`.
#define EXPECT_DATASET_ERROR(statement, file_name, line_no, field_name, substring)                              \
  do {                                                                                                          \
    try {                                                                                                       \
      statement;                                                                                                \
      ADD_FAILURE() << "expected DatasetError containing '" << (substring) << "' from " << #statement;          \
    } catch (DatasetError const& e_) {                                                                          \
      std::printf("[  error   ] %s\n", e_.what());                                                              \
      std::string const what_ = e_.what();                                                                      \
      EXPECT_EQ(e_.file(), (file_name));                                                                        \
      EXPECT_EQ(e_.line(), (line_no));                                                                          \
      EXPECT_EQ(e_.field(), (field_name));                                                                      \
      std::string const where_ = std::string(file_name) + ((line_no) > 0 ? ":" + std::to_string(line_no) : ""); \
      EXPECT_EQ(what_.rfind(where_ + ": ", 0), 0u) << what_;                                                    \
      if (!std::string(field_name).empty()) {                                                                   \
        EXPECT_NE(what_.find("field '" + std::string(field_name) + "'"), std::string::npos) << what_;           \
      }                                                                                                         \
      EXPECT_NE(what_.find(substring), std::string::npos) << "message: " << what_;                              \
    }                                                                                                           \
  } while (0)

std::vector<Example> read_text(std::string const& text, std::int64_t vocab = kVocab) {
  std::istringstream in(text);
  std::vector<Example> out;
  packing::read_jsonl(in, "mem.jsonl", vocab, [&](Example&& ex) { out.push_back(std::move(ex)); });
  return out;
}

void expect_error_on_line(std::string const& text, std::int64_t line, std::string const& field,
                          std::string const& substring) {
  TempFile const file(text);
  EXPECT_DATASET_ERROR(packing::load_jsonl(file.path(), kVocab), file.path(), line, field, substring);
}

TEST(Dataset, ReadsInputIdsAndLabelsInTheHfConvention) {
  auto const examples = read_text(R"({"input_ids": [5, 6, 7], "labels": [-100, 6, 7]})"
                                  "\n"
                                  R"({"input_ids": [9], "labels": [-100], "attention_mask": [1]})");
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].input_ids, (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_EQ(examples[0].labels, (std::vector<std::int32_t>{kIgnoreIndex, 6, 7}));
  EXPECT_EQ(examples[1].input_ids, (std::vector<std::int32_t>{9}));
  EXPECT_EQ(examples[1].labels, (std::vector<std::int32_t>{kIgnoreIndex}));
}

TEST(Dataset, MissingLabelsMeanEveryPositionIsSupervised) {
  auto const examples = read_text(R"({"input_ids": [1, 2, 99]})");
  ASSERT_EQ(examples.size(), 1u);
  EXPECT_EQ(examples[0].labels, examples[0].input_ids);
}

TEST(Dataset, SkipsBlankLinesButCountsThemInLineNumbers) {
  std::string const text = "\n   \n{\"input_ids\": [1]}\r\n\t\n{\"input_ids\": [2, 3]}\n\n";
  auto const examples = read_text(text);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[1].input_ids, (std::vector<std::int32_t>{2, 3}));
  expect_error_on_line("\n\n{\"input_ids\": [1]}\n\n{\"input_ids\": []}\n", 5, "input_ids", "empty example");
}

TEST(Dataset, StreamsExamplesToTheSinkInFileOrder) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "{\"input_ids\": [" + std::to_string(i) + "]}\n";
  std::istringstream in(text);
  std::vector<std::int32_t> seen;
  std::int64_t const n = packing::read_jsonl(in, "mem", kVocab, [&](Example&& ex) { seen.push_back(ex.input_ids[0]); });
  EXPECT_EQ(n, 50);
  ASSERT_EQ(seen.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(seen[i], i);
}

TEST(Dataset, RoundTripsThroughATempFile) {
  auto rng = test_rng();
  std::vector<Example> examples;
  for (int i = 0; i < 40; ++i) {
    Example ex;
    int const len = 1 + static_cast<int>(rng() % 30);
    for (int p = 0; p < len; ++p) {
      std::int32_t const id = static_cast<std::int32_t>(rng() % kVocab);
      ex.input_ids.push_back(id);
      ex.labels.push_back(rng() % 3 == 0 ? kIgnoreIndex : id);
    }
    examples.push_back(ex);
  }
  TempFile const file("");
  packing::write_jsonl(file.path(), examples);
  std::vector<Example> const back = packing::load_jsonl(file.path(), kVocab);
  ASSERT_EQ(back.size(), examples.size());
  for (std::size_t i = 0; i < examples.size(); ++i) {
    EXPECT_EQ(back[i].input_ids, examples[i].input_ids) << "example " << i;
    EXPECT_EQ(back[i].labels, examples[i].labels) << "example " << i;
  }
}

TEST(Dataset, RejectsMalformedJsonNamingFileAndLine) {
  expect_error_on_line("{\"input_ids\": [1]}\n{\"input_ids\": [1, 2\n", 2, "", "malformed JSON");
  expect_error_on_line("[1, 2, 3]\n", 1, "", "one JSON object");
}

TEST(Dataset, RejectsMissingOrNonArrayInputIds) {
  expect_error_on_line("{\"labels\": [1]}\n", 1, "input_ids", "missing");
  expect_error_on_line("{\"input_ids\": [1]}\n{\"input_ids\": 7}\n", 2, "input_ids", "must be an array");
  expect_error_on_line("{\"input_ids\": \"1 2 3\"}\n", 1, "input_ids", "must be an array");
}

TEST(Dataset, RejectsNonIntegerIds) {
  expect_error_on_line("{\"input_ids\": [1, 2.5]}\n", 1, "input_ids", "element 1 is 2.5");
  expect_error_on_line("{\"input_ids\": [1, 2.0]}\n", 1, "input_ids", "not an integer");
  expect_error_on_line("{\"input_ids\": [\"3\"]}\n", 1, "input_ids", "not an integer");
  expect_error_on_line("{\"input_ids\": [true]}\n", 1, "input_ids", "not an integer");
  expect_error_on_line("{\"input_ids\": [1], \"labels\": [null]}\n", 1, "labels", "not an integer");
}

TEST(Dataset, RejectsAnEmptyExample) {
  expect_error_on_line("{\"input_ids\": [4]}\n{\"input_ids\": [], \"labels\": []}\n", 2, "input_ids", "empty example");
}

TEST(Dataset, RejectsIdsOutsideTheVocabulary) {
  expect_error_on_line("{\"input_ids\": [0, 100]}\n", 1, "input_ids",
                       "element 1 is 100, outside the vocabulary [0, 100)");
  expect_error_on_line("{\"input_ids\": [-1]}\n", 1, "input_ids", "outside the vocabulary");
  expect_error_on_line("{\"input_ids\": [-100]}\n", 1, "input_ids", "outside the vocabulary");
  expect_error_on_line("{\"input_ids\": [18446744073709551615]}\n", 1, "input_ids", "outside the vocabulary");
}

TEST(Dataset, RejectsLabelsOfAnotherLength) {
  expect_error_on_line("{\"input_ids\": [1, 2, 3], \"labels\": [1, 2]}\n", 1, "labels",
                       "has 2 entries but input_ids has 3");
  expect_error_on_line("{\"input_ids\": [1], \"labels\": 1}\n", 1, "labels", "must be an array");
}

TEST(Dataset, RejectsLabelsThatAreNeitherIgnoredNorTheToken) {
  expect_error_on_line("{\"input_ids\": [1, 2], \"labels\": [-100, 100]}\n", 1, "labels",
                       "element 1 is 100, outside the vocabulary");
  expect_error_on_line("{\"input_ids\": [1, 2], \"labels\": [-5, 2]}\n", 1, "labels", "not the ignore index -100");
  expect_error_on_line("{\"input_ids\": [1, 2], \"labels\": [1, 3]}\n", 1, "labels",
                       "element 1 is 3 but input_ids[1] is 2");
}

TEST(Dataset, RejectsAMissingFileAndABadVocabulary) {
  EXPECT_DATASET_ERROR(packing::load_jsonl("/nonexistent/fusepack.jsonl", kVocab), "/nonexistent/fusepack.jsonl", 0, "",
                       "cannot open");
  TempFile const file("{\"input_ids\": [1]}\n");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::load_jsonl(file.path(), 0), "vocab_size must be in [1, 2^31]");
}

TEST(Dataset, RejectsDeeplyNestedJsonBeforeParsingIt) {
  // nlohmann's parser recurses once per level: 100,000 levels overflowed the stack (a segfault, not an error).
  std::string const deep = std::string(100000, '[') + std::string(100000, ']');
  expect_error_on_line("{\"input_ids\": [1]}\n{\"input_ids\": [1], \"meta\": " + deep + "}\n", 2, "",
                       "nests arrays and objects more than 64 levels deep");
  std::string const brackets_in_a_string = "\"" + std::string(1000, '[') + "\"";
  EXPECT_EQ(read_text("{\"input_ids\": [1], \"text\": " + brackets_in_a_string + "}\n").size(), 1u);
}

TEST(Dataset, RejectsUtf16NamingTheEncoding) {
  expect_error_on_line(std::string("\xFF\xFE{\0\"\0i\0", 8), 1, "", "is UTF-16 (byte order mark FF FE)");
  expect_error_on_line(std::string("\xFE\xFF\0{\0\"", 6), 1, "", "convert it to UTF-8");
  expect_error_on_line(std::string("{\0\"\0i\0", 6), 1, "", "holds a NUL byte at byte 1");
}

TEST(Dataset, PrettyPrintedJsonIsNamedAsSuch) {
  expect_error_on_line("{\n  \"input_ids\": [1, 2]\n}\n", 1, "", "looks like pretty-printed JSON");
  expect_error_on_line("{\"input_ids\": [1]}\n{\"input_ids\": [1, 2],\n\"labels\": [1, 2]}\n", 2, "",
                       "one whole JSON object per line");
  expect_error_on_line("[{\"input_ids\": [1]}, {\"input_ids\": [2]}]\n", 1, "",
                       "got an array of 2 objects (JSON Lines has one object per line");
  // nlohmann's own tag ("[json.exception.parse_error.101]") is not shown.
  TempFile const file("{\"input_ids\": [1,]}\n");
  try {
    packing::load_jsonl(file.path(), kVocab);
    ADD_FAILURE() << "a malformed line was accepted";
  } catch (DatasetError const& e) {
    EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected JSON Lines: one JSON object per line"), std::string::npos)
        << e.what();
  }
}

TEST(Dataset, RejectsADirectoryNamingIt) {
  std::string const dir = ::testing::TempDir();
  EXPECT_DATASET_ERROR(packing::load_jsonl(dir, kVocab), dir, 0, "", "is a directory; expected a JSON Lines file");
}

TEST(Dataset, RejectsInputIdsOrLabelsGivenTwiceOnALine) {
  // nlohmann keeps the last of two equal keys, so the first input_ids were silently dropped.
  expect_error_on_line("{\"input_ids\": [1]}\n{\"input_ids\": [1, 2], \"input_ids\": [3]}\n", 2, "input_ids",
                       "given twice on the line");
  expect_error_on_line("{\"input_ids\": [1, 2], \"labels\": [1, 2], \"labels\": [-100, 2]}\n", 1, "labels",
                       "given twice on the line");
  // Nested objects may repeat the names; only the example's own fields count.
  EXPECT_EQ(read_text("{\"input_ids\": [1], \"meta\": {\"input_ids\": 1}}\n").size(), 1u);
}

TEST(Dataset, NumberedReaderGivesEachExamplesLine) {
  std::istringstream in("{\"input_ids\": [1]}\n\n{\"input_ids\": [2]}\n");
  std::vector<std::int64_t> lines;
  packing::read_jsonl_numbered(in, "mem.jsonl", kVocab,
                               [&](Example&&, std::int64_t line) { lines.push_back(line); });
  EXPECT_EQ(lines, (std::vector<std::int64_t>{1, 3}));
}

TEST(Dataset, CheckExampleNamesTheBadPosition) {
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::check_example(Example{}, kVocab, "example 3"), "example 3: empty example");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::check_example(Example{{1, 200}, {1, 200}}, kVocab, "example 4"),
                                   "example 4: input_ids[1]=200 is outside the vocabulary [0, 100)");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::check_example(Example{{1, 2}, {1, 3}}, kVocab, "x"),
                                   "labels[1]=3 is neither -100 nor the token input_ids[1]=2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::check_example(Example{{1, 2}, {1}}, kVocab, "x"),
                                   "labels has 1 entries but input_ids has 2");
  EXPECT_NO_THROW(packing::check_example(Example{{1, 2}, {kIgnoreIndex, 2}}, kVocab, "x"));
}

// ------------------------------------------------------------------------------------------------------------------
// Progress of long phases

// A clock the test sets by hand, counting how often it is read, and a Progress writing to a string.
struct ManualClock {
  double now = 1000;  // any origin: only differences count
  int reads = 0;
  std::ostringstream out;
  packing::Progress progress() {
    packing::Progress p;
    p.out = &out;
    p.clock = [this] {
      ++reads;
      return now;
    };
    return p;
  }
};

std::vector<std::string> lines_of(std::string const& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string seconds_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  return buf;
}

TEST(Progress, PrintsAtMostOneLinePerIntervalAndBuildsTheStatusOnlyThen) {
  ManualClock clock;
  packing::Progress const progress = clock.progress();
  ASSERT_EQ(progress.interval_seconds, packing::kProgressIntervalSeconds);
  double const start = clock.now, interval = progress.interval_seconds;
  packing::ProgressPhase phase(&progress, "reading x");
  int built = 0;
  auto status = [&built](double seconds) {
    ++built;
    return "after " + seconds_text(seconds);
  };
  // Due once `interval` has passed since the start, then since the last line printed (not since the last update).
  struct Update {
    double at;  // seconds after the start
    bool prints;
  };
  std::vector<Update> const updates = {{0.5, false},
                                       {interval - 0.01, false},
                                       {interval, true},
                                       {interval + 1, false},
                                       {2 * interval - 0.01, false},
                                       {2 * interval + 0.5, true},
                                       {3 * interval + 0.49, false},
                                       {3 * interval + 0.5, true}};
  std::vector<std::string> expected;
  for (Update const& u : updates) {
    clock.now = start + u.at;
    EXPECT_EQ(phase.update(status), u.prints) << "at " << u.at << " s";
    if (u.prints) expected.push_back("reading x: after " + seconds_text(u.at));
  }
  EXPECT_EQ(built, 3) << "the status text is built only for a line printed";
  EXPECT_EQ(lines_of(clock.out.str()), expected);
}

TEST(Progress, AFastPhaseIsSilentAndALongOneEndsWithItsDuration) {
  ManualClock clock;
  packing::Progress const progress = clock.progress();
  double const interval = progress.interval_seconds;
  {
    packing::ProgressPhase fast(&progress, "fast");
    clock.now += interval - 0.1;
    EXPECT_FALSE(fast.update([](double) { return std::string("never"); }));
    fast.done("12 batches");
  }
  EXPECT_EQ(clock.out.str(), "") << "a phase shorter than the interval prints nothing";
  packing::ProgressPhase slow(&progress, "slow");
  clock.now += interval + 3;
  slow.done("12 batches");
  EXPECT_EQ(lines_of(clock.out.str()), std::vector<std::string>{"slow: 12 batches in " + seconds_text(interval + 3)});
}

TEST(Progress, ANullOrSilentProgressPrintsNothingAndReadsNoClock) {
  ManualClock clock;
  packing::Progress silent = clock.progress();
  silent.out = nullptr;
  int built = 0;
  for (packing::Progress const* p : {static_cast<packing::Progress const*>(nullptr),
                                     static_cast<packing::Progress const*>(&silent)}) {
    packing::ProgressPhase phase(p, "x");
    for (int i = 0; i < 100; ++i) {
      clock.now += 1;
      EXPECT_FALSE(phase.update([&built](double) {
        ++built;
        return std::string();
      }));
    }
    phase.done("y");
  }
  EXPECT_EQ(clock.reads, 0);
  EXPECT_EQ(built, 0);
}

TEST(Progress, BeforeLineRunsBeforeEveryLineOnly) {
  ManualClock clock;
  packing::Progress progress = clock.progress();
  std::string order;
  progress.before_line = [&] { order += "[before " + std::to_string(lines_of(clock.out.str()).size()) + " lines]"; };
  packing::ProgressPhase phase(&progress, "x");
  phase.update([](double) { return std::string("a"); });  // not due
  clock.now += progress.interval_seconds;
  phase.update([](double) { return std::string("b"); });
  clock.now += progress.interval_seconds;
  phase.done("c");
  EXPECT_EQ(order, "[before 0 lines][before 1 lines]");
}

// One clock read per line read: with a clock one second further on at each read, the lines due are predictable, and
// the test derives their figures (lines, megabytes, share, rate) from the file's own text.
TEST(Progress, AJsonlReadReportsLinesMegabytesShareAndRate) {
  std::string line = "{\"input_ids\": [";
  for (int i = 0; i < 150000; ++i) line += i ? ",1" : "1";
  line += "]}";
  int const lines = 7;
  std::string text;
  for (int i = 0; i < lines; ++i) text += line + "\n";
  TempFile const file(text);

  ManualClock clock;
  packing::Progress progress = clock.progress();
  progress.clock = [&clock] {
    ++clock.reads;
    return clock.now++;  // the read at the start gets t, the k-th line's read t + k
  };
  std::int64_t const count = packing::read_jsonl(file.path(), kVocab, [](Example&&) {}, &progress);
  ASSERT_EQ(count, lines);
  auto mb = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
    return std::string(buf);
  };
  double const per_line = static_cast<double>(line.size() + 1), total = per_line * lines;
  std::vector<std::string> expected;
  for (int k = 2; k <= lines; k += 2) {  // due every 2 reads: after lines 2, 4, 6
    char share[64];
    std::snprintf(share, sizeof share, " (%.1f%%), %.1f MB/s", 100.0 * k * per_line / total, k * per_line / 1e6 / k);
    expected.push_back("reading " + file.path() + ": " + std::to_string(k) + " lines, " + mb(k * per_line) + " of " +
                       mb(total) + share);
  }
  // The end: one read after the last line, lines + 1 seconds after the start.
  expected.push_back("reading " + file.path() + ": " + std::to_string(lines) + " examples from " +
                     std::to_string(lines) + " lines, " + mb(total) + " in " + seconds_text(lines + 1));
  EXPECT_EQ(lines_of(clock.out.str()), expected);
}

TEST(Progress, GroupsDigitsInThousands) {
  EXPECT_EQ(packing::grouped(0), "0");
  EXPECT_EQ(packing::grouped(999), "999");
  EXPECT_EQ(packing::grouped(1000), "1,000");
  EXPECT_EQ(packing::grouped(-1234567), "-1,234,567");
}

}  // namespace
}  // namespace fusepack::test
