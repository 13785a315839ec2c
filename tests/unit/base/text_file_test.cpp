// Reading whole files (base/text_file.h): bytes as they are, and an error naming the file,
// what it was to be and why, for a missing file, a directory, a file over the bound and a
// device that never ends.
#include "infera/base/text_file.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>

#include "../test_support.h"

namespace infera {
namespace {

TEST(TextFile, ReadsEveryByte) {
  test::TempDir dir;
  std::string bytes = "line one\r\n";
  bytes.push_back('\0');
  bytes += std::string(200000, 'x') + "\xff\xfe end";
  std::ofstream(dir.file("a.txt"), std::ios::binary) << bytes;
  std::ofstream(dir.file("empty.txt"), std::ios::binary);
  EXPECT_EQ(read_text_file(dir.file("a.txt"), "the text"), bytes);
  EXPECT_EQ(read_text_file(dir.file("empty.txt"), "the text"), "");
  EXPECT_EQ(read_text_file_if_present(dir.file("a.txt"), "the text"), bytes);
  // Exactly at the bound is taken; one byte over is not.
  EXPECT_EQ(read_text_file(dir.file("a.txt"), "the text", bytes.size()), bytes);
  const std::string over = test::error_of([&] { read_text_file(dir.file("a.txt"), "the text", bytes.size() - 1); });
  EXPECT_NE(over.find(dir.file("a.txt") + ": cannot read the text: it is more than the " +
                      std::to_string(bytes.size() - 1) + " bytes taken"),
            std::string::npos)
      << over;
}

TEST(TextFile, NamesTheFileWhatItWasAndWhy) {
  test::TempDir dir;
  const std::string missing = dir.file("nope.txt");
  EXPECT_EQ(test::error_of([&] { read_text_file(missing, "the prompt file"); }),
            missing + ": cannot read the prompt file: No such file or directory");
  EXPECT_FALSE(read_text_file_if_present(missing, "the prompt file").has_value());
  // A path through a file (ENOTDIR) is absent too, as std::filesystem::exists says.
  std::ofstream(dir.file("plain"), std::ios::binary) << "x";
  EXPECT_FALSE(read_text_file_if_present(dir.file("plain") + "/inner.json", "it").has_value());
  const TextFile absent = load_text_file(missing);
  EXPECT_TRUE(absent.absent);
  EXPECT_FALSE(absent.ok());

  // A directory opens on Linux and reads as nothing: it must be an error, not an empty text.
  const std::string folder = dir.path().string();
  EXPECT_EQ(test::error_of([&] { read_text_file(folder, "the template"); }),
            folder + ": cannot read the template: it is a directory");
  EXPECT_NE(test::error_of([&] { read_text_file_if_present(folder, "the template"); }).find("it is a directory"),
            std::string::npos);
  EXPECT_FALSE(load_text_file(folder).absent);
}

TEST(TextFile, BoundsADeviceThatNeverEnds) {
  // /dev/zero has no size to check first: the bound holds as it is read.
  const TextFile f = load_text_file("/dev/zero", 1 << 20);
  EXPECT_EQ(f.error, "it is more than the 1048576 bytes taken");
  EXPECT_TRUE(f.text.empty());
}

// Standard input is read as it is, not reopened by name: /dev/stdin cannot be opened when it is
// a socket (as a parent process's spawn may give), nor is it bounded by a size.
TEST(TextFile, ReadsStandardInputOfAnyKind) {
  const auto with_stdin = [](int fd, const std::function<void()>& fn) {
    const int saved = ::dup(STDIN_FILENO);
    ASSERT_GE(saved, 0);
    ASSERT_EQ(::dup2(fd, STDIN_FILENO), STDIN_FILENO);
    ::close(fd);
    fn();
    ::dup2(saved, STDIN_FILENO);
    ::close(saved);
  };
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ASSERT_EQ(::write(pipe_fds[1], "from a pipe", 11), 11);
  ::close(pipe_fds[1]);
  with_stdin(pipe_fds[0], [] { EXPECT_EQ(read_standard_input("the text"), "from a pipe"); });
  int socket_fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, socket_fds), 0);
  ASSERT_EQ(::write(socket_fds[1], "from a socket", 13), 13);
  ::close(socket_fds[1]);
  with_stdin(socket_fds[0], [] { EXPECT_EQ(read_standard_input("the text"), "from a socket"); });
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ASSERT_EQ(::write(pipe_fds[1], "0123456789", 10), 10);
  ::close(pipe_fds[1]);
  with_stdin(pipe_fds[0], [] {
    EXPECT_EQ(test::error_of([] { read_standard_input("the text", 9); }),
              "cannot read the text from standard input: it is more than the 9 bytes taken");
  });
}

}  // namespace
}  // namespace infera
