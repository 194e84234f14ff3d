"""Fast paths swapped in from outside at load: quantized linears, the fused C++ layer, the batch-1 predictor
loop, the kernels, the codec's ops. Nothing in engine/nets imports them."""
