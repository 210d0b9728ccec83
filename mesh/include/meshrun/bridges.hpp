// The flags that make Megatron-LM or torchtitan build the rank map meshrun placed (`meshrun exec --for`,
// `meshrun plan --for`): the parallel sizes, virtual pipeline stages, sequence parallelism, the ZeRO stage as
// the framework names it, and the batch geometry. A layout the framework cannot express (its rank order, a
// schedule or ZeRO stage it lacks) is refused in one line naming what it needs. Flag names from the
// frameworks' sources (docs/launcher.md, "Bridges"): Megatron-LM d98e8a64, torchtitan b5bcd76c.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshrun/geometry.hpp"
#include "meshrun/job.hpp"
#include "meshrun/layout.hpp"

namespace meshrun {

enum class Framework { megatron, torchtitan };
std::optional<Framework> parse_framework(std::string_view name);  // "megatron" | "torchtitan"
const char* framework_name(Framework f);
const char* framework_key(Framework f);  // "megatron" | "torchtitan": parse_framework's inverse

struct FrameworkFlags {
  std::vector<std::string> flags;  // separate words: "--tensor-model-parallel-size", "2", ...
  std::string refusal;             // non-empty: the one line saying why this layout cannot be expressed
};

// With `geometry` (a template's [training] and [model]) the batch flags and, for torchtitan, the layers per
// pipeline stage are included; without (a layout from flags alone) only the layout's, so that a command's own
// batch flags stay the ones it gives.
FrameworkFlags framework_flags(Framework f, const JobConfig& cfg, const Layout& layout, const BatchGeometry* geometry);

// The vocabulary Megatron-LM builds for `vocab` tokens at tensor-parallel size `tp`: padded up to a multiple of
// --make-vocab-size-divisible-by (default 128) × tp (megatron/training/tokenizer: _vocab_size_with_padding).
long long megatron_padded_vocab(long long vocab, int tp);

// Words of `flags` (flag, value, flag, ...) the command already has: "" when it has none or the same values
// (those are then dropped from *flags, so nothing is said twice), else one line naming the first flag whose
// value differs (the framework's parser would take the last one given, silently).
std::string merge_with_command(const std::vector<std::string>& command, std::vector<std::string>* flags);

}  // namespace meshrun
