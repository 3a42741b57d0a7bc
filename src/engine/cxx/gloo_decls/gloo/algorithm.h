#pragma once
#include "context.h"
