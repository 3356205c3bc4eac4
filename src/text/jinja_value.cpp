#include "jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "unicode.h"

namespace cellm::jinja {
namespace {

int max_item_depth(const std::vector<Value>& items) {
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth());
  return depth;
}

void check_depth(int depth) {
  if (depth > kMaxValueDepth) {
    throw TemplateError("value nested deeper than " + std::to_string(kMaxValueDepth));
  }
}

// Whether Python's str.isprintable() holds for a non-ASCII code point (close
// enough: controls, separators and the common format characters are not).
bool printable(char32_t c) {
  if (c >= 0x80 && c <= 0xA0) return false;
  if (c == 0xAD || c == 0x61C || c == 0x1680 || c == 0x180E || c == 0xFEFF) return false;
  if (c >= 0x2000 && c <= 0x200F) return false;
  if (c >= 0x2028 && c <= 0x202F) return false;
  if (c >= 0x205F && c <= 0x206F) return false;
  if (c == 0x3000) return false;
  if (c >= 0xD800 && c <= 0xDFFF) return false;
  return true;
}

void append_hex(std::string& out, char prefix, uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\%c%0*x", prefix, digits, value);
  out += buf;
}

void repr_string(std::string& out, const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (size_t i = 0; i < s.size();) {
    const unicode::Utf8Unit u = unicode::decode_utf8(s, i);
    const char32_t c = u.code_point;
    if (!u.valid) {
      append_hex(out, 'x', static_cast<uint8_t>(s[i]), 2);
    } else if (c == '\\' || c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      append_hex(out, 'x', c, 2);
    } else if (c >= 0x80 && !printable(c)) {
      if (c < 0x100) {
        append_hex(out, 'x', c, 2);
      } else if (c < 0x10000) {
        append_hex(out, 'u', c, 4);
      } else {
        append_hex(out, 'U', c, 8);
      }
    } else {
      out.append(s, i, u.size_bytes);
    }
    i += u.size_bytes;
  }
  out += quote;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          append_hex(out, 'u', c, 4);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string json_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.as_string();
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kBool:
      return key.as_bool() ? "true" : "false";
    case Value::Kind::kInt:
      return std::to_string(key.as_int());
    case Value::Kind::kFloat:
      return format_float(key.as_float());
    default:
      throw TemplateError("keys must be str, int, float, bool or None, not " + key.type_name());
  }
}

const std::string kComma = ",";
const std::string kSpacedComma = ", ";

void json_into(std::string& out, const Value& v, const JsonFormat& f, int level) {
  const int indent = f.indent;
  if (level > kMaxValueDepth) throw TemplateError("tojson: value nested too deeply");
  const auto newline = [&](int at) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(at), ' ');
  };
  const std::string& item_separator =
      f.item_separator ? *f.item_separator : (indent < 0 ? kSpacedComma : kComma);
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += format_float(d);
      }
      return;
    }
    case Value::Kind::kString:
      json_string(out, v.as_string());
      return;
    case Value::Kind::kList: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_separator;
        newline(level + 1);
        json_into(out, items[i], f, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [key, value] : v.as_dict().items)
        entries.emplace_back(json_key(key), &value);
      if (f.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_separator;
        newline(level + 1);
        json_string(out, entries[i].first);
        out += f.key_separator;
        json_into(out, *entries[i].second, f, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

Value Value::list(std::vector<Value> items, bool is_tuple) {
  const int depth = max_item_depth(items) + 1;
  check_depth(depth);
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  data->depth = depth;
  return Value(ListPtr(std::move(data)));
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  int depth = 0;
  for (const auto& [k, v] : items) depth = std::max({depth, k.depth(), v.depth()});
  check_depth(depth + 1);
  auto data = std::make_shared<DictData>();
  // A named pair, not a structured binding: clang before 16 cannot capture those.
  for (auto& item : items) {
    auto it = std::find_if(data->items.begin(), data->items.end(),
                           [&](const auto& e) { return equals(e.first, item.first); });
    if (it != data->items.end()) {
      it->second = std::move(item.second);
    } else {
      data->items.emplace_back(std::move(item.first), std::move(item.second));
    }
  }
  data->depth = depth + 1;
  return Value(DictPtr(std::move(data)));
}

Value Value::dict_of_distinct_keys(std::vector<std::pair<Value, Value>> items) {
  int depth = 0;
  for (const auto& [k, v] : items) depth = std::max({depth, k.depth(), v.depth()});
  check_depth(depth + 1);
  auto data = std::make_shared<DictData>();
  data->items = std::move(items);
  data->depth = depth + 1;
  return Value(DictPtr(std::move(data)));
}

Value Value::callable(std::string name, std::function<Value(CallArgs&)> fn) {
  return Value(
      CallablePtr(std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)})));
}

double Value::to_double() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return as_float();
}

int Value::depth() const {
  if (is_list()) return as_list().depth;
  if (is_dict()) return as_dict().depth;
  return 0;
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::kString:
      return std::get<StringPtr>(v_).get();
    case Kind::kList:
      return std::get<ListPtr>(v_).get();
    case Kind::kDict:
      return std::get<DictPtr>(v_).get();
    case Kind::kNamespace:
      return std::get<NamespacePtr>(v_).get();
    case Kind::kCallable:
      return std::get<CallablePtr>(v_).get();
    default:
      return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().items.empty();
    case Kind::kDict:
      return !as_dict().items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    default: {
      std::string out;
      repr_into(out, 0);
      return out;
    }
  }
}

std::string Value::repr() const {
  std::string out;
  repr_into(out, 0);
  return out;
}

void Value::repr_into(std::string& out, int depth) const {
  if (depth > kMaxValueDepth) throw TemplateError("value nested too deeply to print");
  switch (kind()) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += as_bool() ? "True" : "False";
      return;
    case Kind::kInt:
      out += std::to_string(as_int());
      return;
    case Kind::kFloat:
      out += format_float(as_float());
      return;
    case Kind::kString:
      repr_string(out, as_string());
      return;
    case Kind::kList: {
      const ListData& list = as_list();
      out += list.is_tuple ? '(' : '[';
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i > 0) out += ", ";
        list.items[i].repr_into(out, depth + 1);
      }
      if (list.is_tuple && list.items.size() == 1) out += ',';
      out += list.is_tuple ? ')' : ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (is_namespace()) out += "<Namespace ";
      out += '{';
      bool first = true;
      const auto item = [&](const Value& key, const Value& value) {
        if (!first) out += ", ";
        first = false;
        key.repr_into(out, depth + 1);
        out += ": ";
        value.repr_into(out, depth + 1);
      };
      if (is_dict()) {
        for (const auto& [k, v] : as_dict().items) item(k, v);
      } else {
        for (const auto& [k, v] : as_namespace().attrs) item(Value::string(k), v);
      }
      out += '}';
      if (is_namespace()) out += '>';
      return;
    }
    case Kind::kCallable:
      out += "<function " + as_callable().name + ">";
      return;
  }
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return as_list().is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

const Value* NamespaceData::find(std::string_view name) const {
  for (const auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

void NamespaceData::set(const std::string& name, Value value) {
  for (auto& [k, v] : attrs) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  attrs.emplace_back(name, std::move(value));
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const ListData& x = a.as_list();
      const ListData& y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const DictData& x = a.as_dict();
      const DictData& y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() < b.to_double();
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x < y;
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw TemplateError("'<' not supported between instances of '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string s(buf, r.ptr);  // "-1.2345e+05": shortest round-trip digits
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  const int exponent = std::stoi(s.substr(e + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = sign;
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      const auto int_digits = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_digits) {
        out += digits + std::string(int_digits - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

std::string to_json(const Value& value, const JsonFormat& format) {
  std::string out;
  json_into(out, value, format, 0);
  return out;
}

}  // namespace cellm::jinja
