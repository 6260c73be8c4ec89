// The model the PyTorch integration is tested and measured with (issue 22): a transformer encoder,
// one forward pass without gradients, then training steps (MSE loss, SGD). Deterministic when
// PyTorch runs on one thread and OpenBLAS on one thread (OPENBLAS_NUM_THREADS=1): dropout is 0 and
// no kernel with a nondeterministic reduction (oneDNN's convolution backward) is used.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace nxmem::torch_engine {

struct transformer_shape {
    std::int64_t layers = 6;
    std::int64_t d_model = 512;
    std::int64_t heads = 8;
    std::int64_t feedforward = 2048;
    std::int64_t batch = 8;
    std::int64_t sequence = 128;
};

// The shape of the tests: the same layers at a size that runs in milliseconds.
inline constexpr transformer_shape small_transformer{2, 32, 4, 64, 2, 8};

class transformer_workload {
public:
    // Model and data are made here, so they come from the allocator installed now.
    explicit transformer_workload(const transformer_shape& shape, std::uint64_t seed = 0) {
        ::torch::manual_seed(seed);
        namespace nn = ::torch::nn;
        model_ = nn::TransformerEncoder(nn::TransformerEncoderOptions(
            nn::TransformerEncoderLayerOptions(shape.d_model, shape.heads)
                .dim_feedforward(shape.feedforward)
                .dropout(0.0),
            shape.layers));
        input_ = ::torch::randn({shape.sequence, shape.batch, shape.d_model});
        target_ = ::torch::randn({shape.sequence, shape.batch, shape.d_model});
        optimizer_ = std::make_unique<::torch::optim::SGD>(model_->parameters(),
                                                           ::torch::optim::SGDOptions(1e-3).momentum(0.9));
    }

    at::Tensor forward() {
        ::torch::NoGradGuard no_gradients;
        return model_->forward(input_);
    }

    // One training step; returns the loss.
    float train_step() {
        optimizer_->zero_grad();
        at::Tensor loss = ::torch::mse_loss(model_->forward(input_), target_);
        loss.backward();
        optimizer_->step();
        return loss.item<float>();
    }

    std::vector<at::Tensor> parameters() const { return model_->parameters(); }
    const at::Tensor& input() const { return input_; }

private:
    ::torch::nn::TransformerEncoder model_{nullptr};
    at::Tensor input_;
    at::Tensor target_;
    std::unique_ptr<::torch::optim::SGD> optimizer_;
};

// What a run produced, compared bit for bit between allocators.
struct workload_outcome {
    at::Tensor output;
    std::vector<std::uint32_t> loss_bits;
    std::vector<at::Tensor> weights;

    bool bitwise_equal(const workload_outcome& other) const {
        if (loss_bits != other.loss_bits || weights.size() != other.weights.size() ||
            !same_bits(output, other.output)) {
            return false;
        }
        for (std::size_t i = 0; i < weights.size(); ++i) {
            if (!same_bits(weights[i], other.weights[i])) {
                return false;
            }
        }
        return true;
    }

private:
    static bool same_bits(const at::Tensor& a, const at::Tensor& b) {
        const at::Tensor x = a.contiguous();
        const at::Tensor y = b.contiguous();
        return x.sizes() == y.sizes() && x.dtype() == y.dtype() &&
               std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
    }
};

// A forward pass, then `steps` training steps.
inline workload_outcome run_workload(const transformer_shape& shape, int steps) {
    transformer_workload workload(shape);
    workload_outcome outcome;
    outcome.output = workload.forward();
    for (int step = 0; step < steps; ++step) {
        float loss = workload.train_step();
        std::uint32_t bits = 0;
        std::memcpy(&bits, &loss, sizeof bits);
        outcome.loss_bits.push_back(bits);
    }
    for (const at::Tensor& weight : workload.parameters()) {
        outcome.weights.push_back(weight.detach().clone());
    }
    return outcome;
}

} // namespace nxmem::torch_engine
