// Front ends of the two executables (kept in the library so tests can drive them in-process).
#pragma once

namespace meshrun::train {

// meshrun-train TEMPLATE.toml [--set section.key=value ...] [--metrics FILE.jsonl]
// Exit codes: 0 done, 2 bad input (one line on stderr from rank 0), 1 other failure.
int train_main(int argc, char** argv);

// meshrun-tokenize OUT INPUT... [--tokenizer FILE] [--format megatron|raw] [--json-key KEY] [--dtype uint16|uint32]
int tokenize_main(int argc, char** argv);

}  // namespace meshrun::train
