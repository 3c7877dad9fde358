// The opaque handles of plugin_api/qlink.h, as the library defines them, and the context
// each belongs to.
#pragma once

#include <memory>

#include "core/collectives.h"
#include "core/communicator.h"
#include "core/context.h"
#include "core/copy_plan.h"

struct qlink_context {
  std::unique_ptr<qlink::Context> impl;
};

struct qlink_comm {
  std::unique_ptr<qlink::Communicator> impl;
};

namespace qlink {
// A prepared plan as the ABI hands it out: the plan and the context it belongs to.
template <typename Plan>
struct PlanHandle {
  Context* ctx = nullptr;
  Plan plan;
};
}  // namespace qlink

struct qlink_copy_plan : qlink::PlanHandle<qlink::CopyPlan> {};
struct qlink_all_reduce_plan : qlink::PlanHandle<qlink::AllReducePlan> {};

namespace qlink {

inline Context& ContextOf(const qlink_context& h) { return *h.impl; }
inline Context& ContextOf(const qlink_comm& h) { return h.impl->context(); }
template <typename Plan>
Context& ContextOf(const PlanHandle<Plan>& h) {
  return *h.ctx;
}

}  // namespace qlink
