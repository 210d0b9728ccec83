// Prints every key of the config schema (config_keys()) with its type, one per line, for the schema walk
// (schema_walk.py): the walk's table must name every key, so a key added to the schema without a probe fails.
#include <cstdio>

#include "meshrun/config.hpp"

int main() {
  using meshrun::ValueType;
  for (const meshrun::KeyInfo& k : meshrun::config_keys()) {
    const char* type = "string";
    switch (k.type) {
      case ValueType::integer: type = "integer"; break;
      case ValueType::number: type = "number"; break;
      case ValueType::string: type = "string"; break;
      case ValueType::boolean: type = "boolean"; break;
      case ValueType::int_or_auto: type = "int_or_auto"; break;
      case ValueType::table: type = "table"; break;
      case ValueType::blend: type = "blend"; break;
    }
    std::printf("%s %s\n", k.key.c_str(), type);
  }
  return 0;
}
