// Checks on JSON text before nlohmann-json parses it, shared by every reader of a user's JSON (JSONL datasets, golden
// files, config.json): nlohmann's parser and dump() recurse once per nesting level, so a deeply nested document
// overflows the stack; UTF-16 text fails with a message about the wrong character. Header-only and free of
// nlohmann-json, so any library may include it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fusepack::packing {

// A JSON value as a message shows it: its text cut to 40 characters, and its type ("[1,2,3] (array)"). For any
// nlohmann-json type (json, ordered_json), which the caller includes.
template <class Json>
std::string describe_json(Json const& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s + " (" + v.type_name() + ")";
}

// The deepest nesting of arrays and objects a reader accepts; fusepack's own files need 4 levels.
inline constexpr int kMaxJsonDepth = 64;

// Empty when `text` may be handed to the parser; otherwise what is wrong with it, as a phrase ("is UTF-16 (byte order
// mark FF FE); convert it to UTF-8", "nests arrays and objects 65 levels deep at byte 64; the limit is 64"). The
// caller adds the file and line. Brackets inside strings do not count.
inline std::string json_text_problem(std::string_view text) {
  auto const byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  if (text.size() >= 2 && ((byte(0) == 0xFF && byte(1) == 0xFE) || (byte(0) == 0xFE && byte(1) == 0xFF))) {
    return std::string("is UTF-16 (byte order mark ") + (byte(0) == 0xFF ? "FF FE" : "FE FF") +
           "); JSON must be UTF-8: convert it to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)";
  }
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char const c = text[i];
    if (c == '\0') {
      return "holds a NUL byte at byte " + std::to_string(i) +
             "; JSON must be UTF-8 text (UTF-16 without a byte order mark? convert it to UTF-8)";
    }
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return "nests arrays and objects more than " + std::to_string(kMaxJsonDepth) + " levels deep (at byte " +
               std::to_string(i) + "); the limit is " + std::to_string(kMaxJsonDepth);
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return {};
}

// nlohmann's parse_error::what() without its "[json.exception.parse_error.101] " tag: "parse error at line 2, column
// 5: syntax error while parsing object key - ...".
inline std::string json_parse_detail(std::string const& what) {
  if (what.rfind("[json.exception.", 0) == 0) {
    std::size_t const end = what.find("] ");
    if (end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

}  // namespace fusepack::packing
