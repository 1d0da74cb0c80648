// The reference's one data type: a dense, row-major fp64 tensor whose dimensions follow the kernels' params
// structs ([T, H, D] for packed activations, [N, H, K, V] for per-example states). Slow and plain on purpose.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace fusepack::ref {

using Index = std::int64_t;
using Shape = std::vector<Index>;
using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::string shape_str(Shape const& shape);  // "[3, 4, 5]"

class Tensor {
 public:
  Tensor() = default;  // undefined: how an absent optional argument is passed (like an undefined at::Tensor)
  explicit Tensor(Shape shape);  // zeros; every dimension must be >= 0
  Tensor(Shape shape, std::vector<double> values);

  bool defined() const { return defined_; }
  Shape const& shape() const { return shape_; }
  Index dim() const { return static_cast<Index>(shape_.size()); }
  Index size(Index d) const;  // d may be negative, counting from the end
  Index numel() const { return data_.size(); }

  double* data() { return data_.data(); }
  double const* data() const { return data_.data(); }
  Eigen::VectorXd& flat() { return data_; }
  Eigen::VectorXd const& flat() const { return data_; }

  // Rows [begin, end) of dimension 0 (the tokens of a packed tensor, the examples of a state), as a new tensor.
  Tensor rows(Index begin, Index end) const;
  // Writes `src` (same trailing dimensions) into this tensor's rows starting at `begin`.
  void set_rows(Index begin, Tensor const& src);

  // Element access by full index; bounds are checked (the reference is never the hot path).
  double& operator()(std::initializer_list<Index> index);
  double operator()(std::initializer_list<Index> index) const;

  // The contiguous last dimension at the given leading index: x.vec({t, h}) is the D-vector of token t, head h.
  Eigen::Map<Eigen::VectorXd> vec(std::initializer_list<Index> leading);
  Eigen::Map<Eigen::VectorXd const> vec(std::initializer_list<Index> leading) const;

  // The contiguous last two dimensions as a row-major matrix: s.mat({n, h}) is the [K, V] state of example n, head h.
  Eigen::Map<RowMatrix> mat(std::initializer_list<Index> leading);
  Eigen::Map<RowMatrix const> mat(std::initializer_list<Index> leading) const;

 private:
  Index offset(std::initializer_list<Index> index, Index trailing_dims) const;

  Shape shape_;
  Eigen::VectorXd data_;
  bool defined_ = false;
};

}  // namespace fusepack::ref
