// Element types and typed views of backend memory: the one DType of the device seam and of the
// communication layer (a buffer a backend allocates is what a communicator sends).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace meshrun::device {

enum class DType : std::uint8_t { f32, f64, bf16, i32, i64 };

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f64: return "fp64";
    case DType::bf16: return "bf16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::bf16: return 2;
    case DType::f32: case DType::i32: return 4;
  }
  return 0;
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }

// A typed view of backend memory (device memory for CUDA, host memory for the CPU backend). Views into
// one allocation are plain copies with an offset (at()); only what Backend::alloc returned is released.
struct Buf {
  void* p = nullptr;
  std::int64_t n = 0;
  DType t = DType::f32;
  Buf at(std::int64_t offset, std::int64_t count) const {
    return {static_cast<char*>(p) + offset * static_cast<std::int64_t>(dtype_size(t)), count, t};
  }
  std::int64_t bytes() const { return n * static_cast<std::int64_t>(dtype_size(t)); }
};

// A view of host memory the caller owns, as a Buf (the CPU backend's memory is host memory).
template <class T>
Buf host_buf(T* p, std::int64_t n) {
  return {const_cast<void*>(static_cast<const void*>(p)), n, dtype_of<std::remove_const_t<T>>()};
}

}  // namespace meshrun::device
