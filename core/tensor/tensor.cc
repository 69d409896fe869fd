#include "core/tensor/tensor.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnaudit {

Tensor::Tensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  bytes_.assign(static_cast<size_t>(num_elements()) * DTypeSize(dtype_), '\0');
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape, std::string bytes)
    : dtype_(dtype), shape_(std::move(shape)), bytes_(std::move(bytes)) {}

Tensor Tensor::View(DType dtype, std::vector<int64_t> shape,
                    absl::string_view bytes,
                    std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.view_ = bytes;
  t.view_owner_ = std::move(owner);
  return t;
}

std::string* Tensor::mutable_bytes() {
  if (view_owner_ != nullptr) {
    bytes_.assign(view_.data(), view_.size());
    view_ = absl::string_view();
    view_owner_.reset();
  }
  return &bytes_;
}

int64_t Tensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

int64_t Tensor::IntAt(int64_t i) const {
  switch (dtype_) {
    case DType::kI32:
      return data<int32_t>()[i];
    case DType::kI64:
      return data<int64_t>()[i];
    case DType::kBool:
      return data<uint8_t>()[i];
    case DType::kInvalid:
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF64:
      break;
  }
  return static_cast<int64_t>(DoubleAt(i));
}

bool CheckedNumElements(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

absl::Status Tensor::CheckLayout(absl::string_view field,
                                 int64_t max_bytes) const {
  if (dtype_ == DType::kInvalid) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": dtype is missing or unknown"));
  }
  int64_t n = 0;
  if (!CheckedNumElements(shape_, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape [", absl::StrJoin(shape_, ","),
                     "] has a negative dimension or overflows"));
  }
  const int64_t size = DTypeSize(dtype_);
  if (n > max_bytes / size) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape [", absl::StrJoin(shape_, ","), "] of ",
                     DTypeName(dtype_), " needs more than the limit of ",
                     max_bytes, " bytes"));
  }
  if (static_cast<int64_t>(bytes().size()) != n * size) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": has ", bytes().size(), " bytes but ", DTypeName(dtype_), "[",
        absl::StrJoin(shape_, ","), "] needs ", n * size));
  }
  return absl::OkStatus();
}

std::string Tensor::DebugString() const {
  if (!present()) return "absent";
  return absl::StrCat(DTypeName(dtype_), "[", absl::StrJoin(shape_, ","), "]");
}

}  // namespace attnaudit
