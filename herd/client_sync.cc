// Client: the synchronous wrappers (Get, Put, Insert, Delete, Cas), the batches (MultiGet,
// MultiPut) and ResultError.
#include "absl/strings/str_format.h"
#include "herd/client.h"

namespace herd {
namespace {

constexpr uint64_t kSyncTag = ~uint64_t{0};

}  // namespace

absl::StatusOr<Result> Client::RunOne(Op op, std::string_view key, std::string_view value,
                                      uint64_t expected_version) {
  if (outstanding_ != 0) {
    return absl::FailedPreconditionError("synchronous calls need no requests outstanding");
  }
  if (absl::Status s = CheckRequest(op, key, value); !s.ok()) return s;
  // The slot's or a landing buffer's last WR may still be read by the fabric (a retransmission
  // queued behind a receiver-not-ready wait, say) though its request was answered: wait for its
  // completion, as RunMany does, bounded by request_deadline.
  const uint64_t keyhash = HashKey(key);
  const Clock::time_point give_up =
      Clock::now() + absl::ToChronoNanoseconds(options_.request_deadline);
  while (!CanSubmit(0, keyhash, value.size())) {
    if (!health_.ok()) return health_;  // a lost server: its WRs may never complete
    if (Clock::now() > give_up) {
      return absl::DeadlineExceededError(
          "the request's buffer was still being read by the fabric at the request deadline");
    }
    Reap();
  }
  if (absl::Status s = Submit(0, op, key, keyhash, value, expected_version, kSyncTag); !s.ok()) {
    return s;
  }
  Result result;
  while (true) {
    if (Poll(absl::MakeSpan(&result, 1)) == 1 && result.tag == kSyncTag) return result;
  }
}

template <typename OnResult>
absl::Status Client::RunMany(Op op, absl::Span<const KeyValue> items, OnResult&& deliver) {
  if (outstanding_ != 0) {
    return absl::FailedPreconditionError("batched calls need no requests outstanding");
  }
  const bool was_batching = std::exchange(batching_, true);
  std::vector<Result> results(std::max<size_t>(items.size(), 1));
  size_t next = 0, done = 0;
  // Bounds a wait for a slot that never frees (a stuck QP with nothing outstanding): measured
  // from the last progress, not from the call's start (a long batch is not late).
  const auto patience = absl::ToChronoNanoseconds(options_.request_deadline);
  Clock::time_point give_up = Clock::now() + patience;
  while (done < items.size()) {
    if (outstanding_ == 0 && Clock::now() > give_up) {
      for (; next < items.size(); ++next, ++done) {
        deliver(next, absl::DeadlineExceededError("no request slot freed up in time"));
      }
      break;
    }
    // Stage what the windows hold: it goes out at Poll, one doorbell per worker QP.
    for (; next < items.size(); ++next) {
      const KeyValue& item = items[next];
      // A request no server could take fails now (Submit's other kResourceExhausted means
      // "later", and NO_MEMORY is one too).
      if (absl::Status s = CheckRequest(op, item.key, item.value); !s.ok()) {
        deliver(next, s);
        ++done;
        continue;
      }
      if (!CanSubmit(0, HashKey(item.key), item.value.size())) break;
      if (absl::Status s = Submit(0, op, item.key, item.value, 0, next); !s.ok()) {
        if (absl::IsResourceExhausted(s)) break;  // the slot's buffer is still being read
        deliver(next, s);
        ++done;
      }
    }
    const size_t got = Poll(absl::MakeSpan(results));
    for (size_t i = 0; i < got; ++i) {
      deliver(results[i].tag, results[i]);
      ++done;
    }
    if (got > 0) give_up = Clock::now() + patience;
  }
  batching_ = was_batching;
  return absl::OkStatus();
}

std::vector<absl::StatusOr<Value>> Client::MultiGet(absl::Span<const std::string_view> keys) {
  std::vector<KeyValue> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) items[i].key = keys[i];
  std::vector<absl::StatusOr<Value>> out(keys.size());
  const absl::Status run = RunMany(Op::kGet, items, [&](uint64_t i, const auto& r) {
    if constexpr (std::is_same_v<std::decay_t<decltype(r)>, absl::Status>) {
      out[i] = r;
    } else if (absl::Status error = ResultError(r); !error.ok()) {
      out[i] = error;
    } else {
      out[i] = Value{std::string(r.value), r.version};
    }
  });
  if (!run.ok()) out.assign(keys.size(), run);
  return out;
}

std::vector<absl::StatusOr<uint64_t>> Client::MultiPut(absl::Span<const KeyValue> items) {
  std::vector<absl::StatusOr<uint64_t>> out(items.size());
  const absl::Status run = RunMany(Op::kPut, items, [&](uint64_t i, const auto& r) {
    if constexpr (std::is_same_v<std::decay_t<decltype(r)>, absl::Status>) {
      out[i] = r;
    } else if (absl::Status error = ResultError(r); !error.ok()) {
      out[i] = error;
    } else {
      out[i] = r.version;
    }
  });
  if (!run.ok()) out.assign(items.size(), run);
  return out;
}

absl::Status ResultError(const Result& r) {
  const std::string name(StatusName(r.status));
  switch (r.status) {
    case Status::kOk:
      return absl::OkStatus();
    case Status::kNotFound:
      return absl::NotFoundError(name + ": no such key");
    case Status::kCasFailed:
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: the key's current version is %d", name, r.version));
    case Status::kExists:
      return absl::AlreadyExistsError(
          absl::StrFormat("%s: the key is present, at version %d", name, r.version));
    case Status::kNoMemory:
      return absl::ResourceExhaustedError(
          name +
          (r.op == Op::kGet
               ? ": the value is longer than the server's landing buffers can hold for a copy "
                 "(its --landing_value_bytes)"
               : ": the worker has no room for the item (cache mode: it is longer than the "
                 "whole log, --mica_log_bytes; store mode: the slab pool, --mica_pool_bytes, or "
                 "the index's extra buckets are full); nothing was stored or evicted"));
    case Status::kInternal:
      return absl::InternalError(
          name +
          ": the server could not serve it through an inconsistency of its own (e.g. an item in "
          "its log that fails its checksum), not the request's fault: see the server's log");
    case Status::kBackupBusy:
      return absl::UnavailableError(
          name +
          ": the backup could not read a whole copy while its primary's writes landed "
          "(or its primary died mid-batch): ask again, or ask the primary");
    case Status::kNotPrimary:
      return absl::FailedPreconditionError(name +
                                           ": the server is a backup; writes go to the primary");
    case Status::kKeyTooLong:
      return absl::InvalidArgumentError(name +
                                        ": the key is empty or longer than the server takes");
    case Status::kValueTooLong:
      return absl::OutOfRangeError(name + ": the value is longer than the server takes");
    case Status::kBufferTooSmall:
      return absl::ResourceExhaustedError(name + ": the value does not fit a response");
    case Status::kInvalidOp:
      return absl::InvalidArgumentError(name + ": the server does not know this operation");
    case Status::kBadRequest:
      return absl::InvalidArgumentError(name + ": the server refused the request's fields");
    case Status::kWrongWorker:
      return absl::FailedPreconditionError(
          name + ": the key belongs to another worker (client and server disagree on routing)");
    case Status::kTimedOut:
      return absl::DeadlineExceededError(name + ": no response through every retransmission");
    case Status::kSendFailed:
      return absl::UnavailableError(name + ": the request could not be sent (its QP is in error)");
  }
  return absl::InternalError(
      absl::StrFormat("unknown status %d from the server", static_cast<int>(r.status)));
}

absl::StatusOr<Value> Client::Get(std::string_view key) {
  absl::StatusOr<Result> r = RunOne(Op::kGet, key, {}, 0);
  if (!r.ok()) return r.status();
  if (absl::Status error = ResultError(*r); !error.ok()) return error;
  return Value{std::string(r->value), r->version};
}

namespace {
absl::StatusOr<uint64_t> VersionOf(const absl::StatusOr<Result>& r) {
  if (!r.ok()) return r.status();
  if (absl::Status error = ResultError(*r); !error.ok()) return error;
  return r->version;
}
}  // namespace

absl::StatusOr<uint64_t> Client::Put(std::string_view key, std::string_view value) {
  return VersionOf(RunOne(Op::kPut, key, value, 0));
}

absl::StatusOr<uint64_t> Client::Insert(std::string_view key, std::string_view value) {
  return VersionOf(RunOne(Op::kInsert, key, value, 0));
}

absl::StatusOr<uint64_t> Client::Delete(std::string_view key) {
  return VersionOf(RunOne(Op::kDelete, key, {}, 0));
}

absl::StatusOr<uint64_t> Client::Cas(std::string_view key, uint64_t expected_version,
                                     std::string_view value) {
  return VersionOf(RunOne(Op::kCas, key, value, expected_version));
}

}  // namespace herd
