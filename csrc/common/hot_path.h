// Marks the functions every brick op runs. GCC and Clang place such functions together
// (.text.hot), so the few kilobytes of brick code an op runs, cold again at each op after
// Python's and PyTorch's own code, share cache lines and sequential prefetch instead of lying
// scattered through the library.
#pragma once

#define BRICK_HOT_PATH [[gnu::hot]]
