// Fuzzes chat templates: Jinja parse (ChatTemplate::parse) and render. The
// bytes up to the first NUL are the template (mutations of the seed templates
// of real models and of synthetic ones); after it come NUL-separated role and
// content strings, the messages (a fixed system/user/assistant/user
// conversation when there are none). A template that parses renders the
// messages with and without the generation prompt: any answer is fine, a
// crash, a sanitizer report or an input slower than the fuzz timeout is not
// (the render limits bound the work).
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "cellm/chat_template.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t nul = bytes.find('\0', start);
    parts.push_back(bytes.substr(start, nul == std::string::npos ? nul : nul - start));
    if (nul == std::string::npos) break;
    start = nul + 1;
  }
  std::vector<cellm::ChatMessage> messages;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) messages.push_back({parts[i], parts[i + 1]});
  if (messages.empty()) {
    messages = {{"system", "Be brief."},
                {"user", "Hello!"},
                {"assistant", "Hi. How can I help?"},
                {"user", "Count to three."}};
  }
  std::tm now{};
  now.tm_year = 126;
  now.tm_mon = 11;
  now.tm_mday = 6;
  cellm::Result<cellm::ChatTemplate> t =
      cellm::ChatTemplate::parse(parts[0], "<|begin_of_text|>", "<|eot_id|>", now);
  if (!t.ok()) {
    FUZZ_CHECK(!t.status().message().empty(), "a parse error says what is wrong");
    return 0;
  }
  for (bool add_generation_prompt : {false, true}) {
    cellm::Result<std::string> out = t->render(messages, add_generation_prompt);
    if (out.ok()) {
      FUZZ_CHECK(out->size() <= (size_t{1} << 20), "output within the 1 MiB limit");
    } else {
      FUZZ_CHECK(!out.status().message().empty(), "a render error says what is wrong");
    }
  }
  return 0;
}
