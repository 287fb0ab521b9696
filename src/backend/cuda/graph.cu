#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace augur::cuda {

class Graph {
 public:
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

void GraphDeleter::operator()(Graph* g) const { delete g; }

void begin_capture() {
  // Thread-local mode: another thread's unrelated CUDA calls do not break the capture.
  AUGUR_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
}

GraphPtr end_capture() {
  GraphPtr g(new Graph());
  AUGUR_CUDA(cudaStreamEndCapture(stream(), &g->graph));
  AUGUR_CUDA(cudaGraphInstantiate(&g->exec, g->graph, 0));
  return g;
}

void abort_capture() noexcept {
  cudaGraph_t partial = nullptr;
  if (cudaStreamEndCapture(stream(), &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
  (void)cudaGetLastError();
}

void launch(Graph& g) { AUGUR_CUDA(cudaGraphLaunch(g.exec, stream())); }

}  // namespace augur::cuda
