"""The small CNN both torch scripts train (8×8 single-channel inputs, 10 classes); imported
from the scripts' own folder, which Python puts first on sys.path."""

from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 10))

    def forward(self, x):
        return self.head(self.pool(self.relu(self.conv1(x))))
