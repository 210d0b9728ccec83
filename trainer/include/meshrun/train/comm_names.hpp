// The trainer names the communication layer's types unqualified (comm/: the interface, the size-1 and the
// MPI backends); this is the one place that brings them into meshrun::train.
#pragma once
#include "meshrun/comm/groups.hpp"

namespace meshrun::train {
using comm::Buf;
using comm::Comm;
using comm::DType;
using comm::dtype_of;
using comm::dtype_size;
using comm::ForwardingComm;
using comm::Groups;
using comm::host_buf;
using comm::LocalComm;
using comm::make_local_groups;
using comm::reduce_blocks;
using comm::ReduceOp;
using comm::Request;
}  // namespace meshrun::train
