#include "reference/rope.h"
