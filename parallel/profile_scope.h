// Profile scopes: a named region that ditstudio-bench --profile (app/bench/bench_profile.cpp)
// attributes to a step category. The project's own kernels (plain loops, MPI calls) are not ATen
// operators, so the operator callbacks alone cannot see them; a scope names them. Outside a
// profile a scope costs one thread-local check (at::RecordFunction with no callback installed).
//
// Names are "dit::<category>::<what>", category one of gemm, attention, norm (norms and
// modulation), rope, copy (copies and layout changes), elementwise, collective, other, e.g.
//   DIT_PROFILE_SCOPE("dit::attention::cpu_math");
// Everything that runs inside a scope (its own loops and the ATen operators it calls) counts to the
// scope's category; the outermost scope wins when scopes nest. Torch's own profiler
// (torch.profiler / Kineto) shows the same regions as user scopes.
#pragma once

#include <ATen/record_function.h>

namespace dit {

/// RAII region for the step profile; `name` must be a string literal (it is kept by pointer).
class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(name, c10::ArrayRef<const c10::IValue>{});
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  at::RecordFunction rf_;
};

}  // namespace dit

#define DIT_PROFILE_SCOPE_CAT2(a, b) a##b
#define DIT_PROFILE_SCOPE_CAT(a, b) DIT_PROFILE_SCOPE_CAT2(a, b)
/// A ProfileScope named `name` until the end of the enclosing block.
#define DIT_PROFILE_SCOPE(name) \
  ::dit::ProfileScope DIT_PROFILE_SCOPE_CAT(dit_profile_scope_, __COUNTER__)(name)
