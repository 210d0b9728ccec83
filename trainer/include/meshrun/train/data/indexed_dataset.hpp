// Megatron-LM's indexed dataset: PREFIX.bin (the token ids of every sequence, back to back) and PREFIX.idx
// (where each sequence starts, how long it is, which sequences form each document). The layout follows
// megatron/core/datasets/indexed_dataset.py (_IndexWriter / _IndexReader), version 1:
//   magic "MMIDIDX\0\0" (9 bytes), version <Q = 1, dtype code <B, sequence count <Q, document count <Q,
//   int32 sequence lengths [sequence count], int64 byte pointers into .bin [sequence count],
//   int64 document indices [document count] (starting with 0; document d is sequences [idx[d], idx[d+1])).
// Multimodal datasets append int8 sequence modes; text datasets have none, and a trailing array is refused.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace meshrun::train {

// Megatron-LM's DType codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
// Token ids are written as uint16 (code 8) or int32 (code 4, what Megatron's preprocess_data.py picks for
// vocabularies >= 65500); the reader accepts the integer codes 1, 2, 3, 4, 5, 8.
int indexed_dtype_code(const std::string& token_dtype);  // "uint16" -> 8, "uint32"/"int32" -> 4; DataError otherwise

class IndexedDatasetWriter {
 public:
  // Writes PREFIX.bin.tmp and PREFIX.idx.tmp; finish() renames both into place (.bin first, so a reader
  // never finds an .idx whose .bin is missing).
  IndexedDatasetWriter(std::string prefix, int dtype_code);
  ~IndexedDatasetWriter();  // removes the temporaries when finish() was not reached
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence that is one document (preprocess_data.py without sentence splitting). DataError if an id
  // does not fit the dtype; nothing of that document is written then.
  void add_document(const std::uint32_t* ids, std::size_t n);
  void finish();

 private:
  std::string prefix_;
  int code_, width_;
  std::FILE* bin_ = nullptr;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> pointers_;
  std::int64_t bytes_ = 0;
  std::vector<unsigned char> scratch_;
  bool finished_ = false;
};

class IndexedDataset {
 public:
  // PREFIX may also be given as PREFIX.bin or PREFIX.idx. Every inconsistency (magic, version, dtype,
  // sizes, pointers that are not back to back, document indices out of order) is one DataError line
  // naming the file and what is wrong.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  std::int64_t sequences() const { return sequences_; }
  std::int64_t documents() const { return static_cast<std::int64_t>(doc_index_.size()) - 1; }
  std::int64_t tokens() const { return tokens_; }
  int dtype_code() const { return code_; }
  std::int64_t sequence_start(std::int64_t i) const;   // unchecked index
  std::int64_t sequence_length(std::int64_t i) const;  // unchecked index
  const std::vector<std::int64_t>& document_indices() const { return doc_index_; }
  const std::string& prefix() const { return prefix_; }
  // The i-th token of the whole .bin (unchecked index; sequences are back to back, checked at open).
  std::uint32_t token(std::int64_t i) const;
  // DataError naming the first id >= vocab (or negative, for the signed dtypes).
  void check_ids_below(std::int64_t vocab) const;

 private:
  std::int64_t value(std::int64_t i) const;  // the stored value, sign-extended for signed dtypes
  std::string prefix_;
  int code_ = 0, width_ = 0;
  // The .idx stays mapped (Megatron memory-maps it too): only the document indices are copied.
  const unsigned char* idx_ = nullptr;
  std::size_t idx_bytes_ = 0;
  std::int64_t sequences_ = 0;
  std::vector<std::int64_t> doc_index_;
  std::int64_t tokens_ = 0;
  const unsigned char* bin_ = nullptr;
  std::size_t bin_bytes_ = 0;
};

}  // namespace meshrun::train
