#include "reference/tensor.h"

#include <sstream>
#include <stdexcept>

namespace fusepack::ref {

std::string shape_str(Shape const& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

static Index checked_numel(Shape const& shape) {
  Index n = 1;
  for (Index s : shape) {
    if (s < 0) throw std::invalid_argument("Tensor: negative dimension in shape " + shape_str(shape));
    n *= s;
  }
  return n;
}

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), data_(Eigen::VectorXd::Zero(checked_numel(shape_))), defined_(true) {}

Tensor::Tensor(Shape shape, std::vector<double> values) : Tensor(std::move(shape)) {
  if (static_cast<Index>(values.size()) != numel()) {
    throw std::invalid_argument("Tensor: " + std::to_string(values.size()) + " values for shape " + shape_str(shape_));
  }
  data_ = Eigen::Map<Eigen::VectorXd>(values.data(), numel());
}

Index Tensor::size(Index d) const {
  Index const nd = dim();
  Index const i = d < 0 ? d + nd : d;
  if (i < 0 || i >= nd) {
    throw std::out_of_range("Tensor::size(" + std::to_string(d) + ") on shape " + shape_str(shape_));
  }
  return shape_[i];
}

Index Tensor::offset(std::initializer_list<Index> index, Index trailing_dims) const {
  Index const nd = dim();
  if (static_cast<Index>(index.size()) + trailing_dims != nd) {
    throw std::out_of_range("Tensor: " + std::to_string(index.size()) + " indices for shape " + shape_str(shape_));
  }
  Index off = 0, d = 0;
  for (Index i : index) {
    if (i < 0 || i >= shape_[d]) {
      throw std::out_of_range("Tensor: index " + std::to_string(i) + " out of range in dimension " + std::to_string(d) +
                              " of shape " + shape_str(shape_));
    }
    off = off * shape_[d] + i;
    ++d;
  }
  for (; d < nd; ++d) off *= shape_[d];
  return off;
}

static Index row_size(Shape const& shape) {
  Index n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

Tensor Tensor::rows(Index begin, Index end) const {
  if (dim() < 1 || begin < 0 || end < begin || end > shape_[0]) {
    throw std::out_of_range("Tensor::rows(" + std::to_string(begin) + ", " + std::to_string(end) + ") on shape " +
                            shape_str(shape_));
  }
  Shape shape = shape_;
  shape[0] = end - begin;
  Tensor out(shape);
  out.data_ = data_.segment(begin * row_size(shape_), out.numel());
  return out;
}

void Tensor::set_rows(Index begin, Tensor const& src) {
  Shape expected = shape_;
  if (dim() >= 1) expected[0] = src.dim() >= 1 ? src.shape()[0] : -1;
  if (dim() < 1 || src.shape() != expected || begin < 0 || begin + src.shape()[0] > shape_[0]) {
    throw std::out_of_range("Tensor::set_rows(" + std::to_string(begin) + ", " + shape_str(src.shape()) +
                            ") on shape " + shape_str(shape_));
  }
  data_.segment(begin * row_size(shape_), src.numel()) = src.data_;
}

double& Tensor::operator()(std::initializer_list<Index> index) { return data_[offset(index, 0)]; }
double Tensor::operator()(std::initializer_list<Index> index) const { return data_[offset(index, 0)]; }

Eigen::Map<Eigen::VectorXd> Tensor::vec(std::initializer_list<Index> leading) {
  return {data_.data() + offset(leading, 1), shape_.back()};
}
Eigen::Map<Eigen::VectorXd const> Tensor::vec(std::initializer_list<Index> leading) const {
  return {data_.data() + offset(leading, 1), shape_.back()};
}
Eigen::Map<RowMatrix> Tensor::mat(std::initializer_list<Index> leading) {
  return {data_.data() + offset(leading, 2), shape_[dim() - 2], shape_.back()};
}
Eigen::Map<RowMatrix const> Tensor::mat(std::initializer_list<Index> leading) const {
  return {data_.data() + offset(leading, 2), shape_[dim() - 2], shape_.back()};
}

}  // namespace fusepack::ref
