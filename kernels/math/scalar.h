// The kernels' name for the correctly rounded scalar operations
// (core/arithmetic/rounded_ops.h), which the CPU merge routine shares.
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_SCALAR_H_
#define ATTNAUDIT_KERNELS_MATH_SCALAR_H_

#include "core/arithmetic/rounded_ops.h"

namespace attnaudit {
namespace kmath {

template <typename T>
using Ops = ::attnaudit::rounded::Ops<T>;
using ::attnaudit::rounded::BitsAsDouble;
using ::attnaudit::rounded::BitsAsFloat;
using ::attnaudit::rounded::DoubleBits;
using ::attnaudit::rounded::FloatBits;
using ::attnaudit::rounded::MaxStep;

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_SCALAR_H_
