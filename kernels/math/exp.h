// The kernels' names for the scalar exp of core/arithmetic/scalar_exp.h (the
// same bits on the host and the GPU). Pure; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_EXP_H_
#define ATTNAUDIT_KERNELS_MATH_EXP_H_

#include "core/arithmetic/scalar_exp.h"
#include "kernels/math/scalar.h"

namespace attnaudit {
namespace kmath {

using ::attnaudit::rounded::ExpNonPositive;
using ::attnaudit::rounded::LogPositive;
using ::attnaudit::rounded::ReduceLn2;
using ::attnaudit::rounded::ScaleByPow2;

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_EXP_H_
