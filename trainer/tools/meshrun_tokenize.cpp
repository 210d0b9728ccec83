#include "meshrun/train/run/cli.hpp"
int main(int argc, char** argv) { return meshrun::train::tokenize_main(argc, argv); }
