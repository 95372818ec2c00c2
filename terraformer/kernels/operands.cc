// Layouts of the fused kernels' operands and results, and their readers
// (operands.h).
#include "operands.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace terraformer::kernels {

namespace {

const char* TypeName(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return "f32";
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::S8: return "s8";
    case ffi::DataType::S32: return "s32";
    case ffi::DataType::PRED: return "pred";
    case kAny: return "any";
    default: return "?";
  }
}

// A layout without `name` means the code that reads it disagrees with the
// layout it wrote: a bug, not a caller's mistake.
size_t Found(const Layout& layout, const std::string& name) {
  const size_t i = layout.Index(name);
  if (i == layout.size()) {
    std::fprintf(stderr, "terraformer kernels: no operand or result %s\n",
                 name.c_str());
    std::abort();
  }
  return i;
}

}  // namespace

Layout& Layout::Add(const std::string& name, ffi::DataType type,
                    bool in_place) {
  entries_.push_back({name, type, in_place});
  return *this;
}

size_t Layout::Index(const std::string& name) const {
  size_t i = 0;
  while (i < entries_.size() && entries_[i].name != name) ++i;
  return i;
}

std::string Layout::Describe() const {
  std::string lines;
  for (const Entry& e : entries_) {
    lines += e.name + " " + TypeName(e.type) + (e.in_place ? " in_place" : "") +
             "\n";
  }
  return lines;
}

std::string ArgReader::Check() const {
  if (layout_.size() != args_.size()) {
    return "expected " + std::to_string(layout_.size()) + " operands, got " +
           std::to_string(args_.size());
  }
  for (size_t i = 0; i < layout_.size(); ++i) {
    auto any = args_.get<ffi::AnyBuffer>(i);
    if (!any.has_value()) return "operand " + std::to_string(i) + " is not a buffer";
    const ffi::DataType t = any->element_type();
    const ffi::DataType want = layout_.type(i);
    const bool ok = want == kAny ? (t == ffi::DataType::F32 ||
                                    t == ffi::DataType::S8 ||
                                    t == ffi::DataType::BF16)
                                 : t == want;
    if (!ok) return "operand " + std::to_string(i) + " has the wrong type";
  }
  return "";
}

size_t ArgReader::At(const std::string& name) const {
  return Found(layout_, name);
}

Results::Results(const ffi::RemainingRets& rets, const Layout& layout)
    : layout_(layout) {
  const size_t n = layout.size();
  if (rets.size() != n) {
    problem_ = "expected " + std::to_string(n) + " results, got " +
               std::to_string(rets.size());
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    auto r = rets.get<ffi::Buffer<ffi::F32>>(i);
    if (!r.has_value()) {
      problem_ = "result " + std::to_string(i) + ": " + r.error().message();
      return;
    }
    data_.push_back((*r)->typed_data());
    count_.push_back((*r)->element_count());
  }
}

size_t Results::At(const std::string& name) const {
  return Found(layout_, name);
}

}  // namespace terraformer::kernels
