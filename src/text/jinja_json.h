// JSON -> jinja::Value, as Python's json.loads gives a template its data:
// null -> None, true/false -> bool, integers -> int, other numbers -> float,
// strings -> str, arrays -> list, objects -> dict in the object's key order.
// Private to src/text.
#pragma once

#include <nlohmann/json.hpp>

#include "jinja_value.h"

namespace cellm::jinja {

// Throws TemplateError when the JSON nests deeper than kMaxValueDepth.
Value from_json(const nlohmann::ordered_json& json);

}  // namespace cellm::jinja
