// Helpers shared by the GoogleTest suites (gtest without gmock).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

// Substring check through gtest's IsSubstring predicate formatter.
#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, std::string(needle), std::string(haystack))

namespace brick::test {

// Runs `fn`, expects it to throw `ErrorType` (named `expected` in failure messages), and
// returns the error's message (without a backtrace where the error type keeps one apart).
template <typename ErrorType, typename Fn>
std::string thrown_message(Fn&& fn, const char* expected) {
  try {
    fn();
  } catch (const ErrorType& error) {
    if constexpr (requires { error.what_without_backtrace(); }) {
      return error.what_without_backtrace();
    } else {
      return error.what();
    }
  } catch (const std::exception& other) {
    ADD_FAILURE() << "expected " << expected << ", got another exception: " << other.what();
    return {};
  }
  ADD_FAILURE() << "expected " << expected << ", nothing was thrown";
  return {};
}

}  // namespace brick::test
