// Tensor: a dense, row-major, little-endian n-d array.
//
// Its bytes are either owned, in a std::string (so the wire codec can move
// a received protobuf `bytes` field into a Tensor without copying), or a
// read-only view of memory kept alive by a shared owner (a mapped snapshot
// file: `attnaudit check` never copies tensor bytes). Copying a Tensor
// copies owned bytes and shares a view. Any mutable accessor first turns a
// view into owned bytes (one copy), so writes never reach the viewed
// memory. A Tensor is a value type; it is not synchronised (share it
// read-only between threads).
// A default-constructed Tensor is "absent": dtype kInvalid, no shape, no
// bytes. Shape/size consistency is checked by Tensor::CheckLayout and by
// snapshot validation, never assumed by accessors beyond debug asserts.
#ifndef ATTNAUDIT_CORE_TENSOR_TENSOR_H_
#define ATTNAUDIT_CORE_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/tensor/dtype.h"

namespace attnaudit {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);  // zero-filled
  Tensor(DType dtype, std::vector<int64_t> shape, std::string bytes);

  // A view of `bytes`, which `owner` keeps alive (and unchanged) for as
  // long as any copy of the tensor exists.
  static Tensor View(DType dtype, std::vector<int64_t> shape,
                     absl::string_view bytes,
                     std::shared_ptr<const void> owner);

  bool present() const { return dtype_ != DType::kInvalid; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  // Product of the shape; 1 for rank 0. Callers must have checked for
  // overflow with CheckLayout first when the shape came from the wire.
  int64_t num_elements() const;

  absl::string_view bytes() const {
    return view_owner_ ? view_ : absl::string_view(bytes_);
  }
  bool is_view() const { return view_owner_ != nullptr; }
  // Owned bytes (a view is copied into them first).
  std::string* mutable_bytes();
  const void* raw() const { return bytes().data(); }
  void* mutable_raw() { return &(*mutable_bytes())[0]; }

  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes().data());
  }
  template <typename T>
  T* mutable_data() {
    return reinterpret_cast<T*>(mutable_raw());
  }

  // Integer element i of an i32/i64 tensor, widened to int64.
  int64_t IntAt(int64_t i) const;
  // Floating element i, widened exactly.
  double DoubleAt(int64_t i) const { return LoadAsDouble(raw(), dtype_, i); }
  float FloatAt(int64_t i) const { return LoadAsFloat(raw(), dtype_, i); }

  // OK when the shape has non-negative dims whose product times the element
  // size neither overflows nor exceeds `max_bytes`, and equals bytes().size().
  // Errors name `field`.
  absl::Status CheckLayout(absl::string_view field, int64_t max_bytes) const;

  // "bf16[8,1,32,128]"
  std::string DebugString() const;

 private:
  DType dtype_ = DType::kInvalid;
  std::vector<int64_t> shape_;
  std::string bytes_;       // when owned
  absl::string_view view_;  // when a view: the bytes, alive through the owner
  std::shared_ptr<const void> view_owner_;
};

// Checked product of dims; false on overflow or a negative dim.
bool CheckedNumElements(const std::vector<int64_t>& shape, int64_t* out);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_TENSOR_TENSOR_H_
