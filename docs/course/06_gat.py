# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 6. Graph attention (GAT) on Zachary's karate club
#
# Seed 003's last slide, "Attention is pervasive", shows the graph attention network (Veličković
# et al., *Graph attention networks*, ICLR 2018) and asks "What's the style of this attention?
# A: additive":
#
# $$\alpha_{ij} = \frac{\exp\big(\mathrm{LeakyReLU}(\vec a^\top [W \vec h_i \,\|\, W \vec h_j])\big)}
# {\sum_{k \in \mathcal N_i} \exp\big(\mathrm{LeakyReLU}(\vec a^\top [W \vec h_i \,\|\, W \vec h_k])\big)},
# \qquad \vec h_i' = \sum_{j \in \mathcal N_i} \alpha_{ij} W \vec h_j .$$
#
# A node is a query, its neighbours $\mathcal N_i$ are the keys and values: the same weighted sum as
# a decoder step, with the graph deciding who may attend to whom. Splitting $\vec a$ into the half
# that meets $W\vec h_i$ and the half that meets $W\vec h_j$ gives the form the package computes,
#
# $$e_{ij} = \mathrm{LeakyReLU}(a_{dst} \cdot W h_i + a_{src} \cdot W h_j),$$
#
# and, as in the paper, $\mathcal N_i$ includes $i$ itself (a self loop) and the slope is 0.2.
# Several heads are concatenated in hidden layers and averaged in the output layer (paper,
# eqs. 5-6). `ta.nn.GraphAttention(in_features, out_features, heads, concat)` returns the new
# features and the coefficients $\alpha$, (heads, N, N).

# %%
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn import Tensor

ta.set_num_threads(1)
np.set_printoptions(precision=3, suppress=True)

# %% [markdown]
# ## The graph
#
# Zachary (1977) recorded who met whom outside a university karate club: 34 members, 78
# friendships. The club then split in two, around the instructor ("Mr. Hi", node 0) and the
# administrator ("Officer", node 33); networkx ships the graph with each member's side.

# %%
G = nx.karate_club_graph()
N = G.number_of_nodes()
adjacency = nx.to_numpy_array(G, nodelist=range(N)) > 0          # (N, N) bool, True = i attends to j
faction = np.array([0 if G.nodes[i]["club"] == "Mr. Hi" else 1 for i in range(N)])
print(f"{N} members, {G.number_of_edges()} friendships, sides of {np.bincount(faction)} members")

# %% [markdown]
# ## One node's coefficients by hand
#
# An untrained layer, node 0 and its neighbours: the formula above, in numpy, against
# `ta.nn.GraphAttention`.

# %%
ta.manual_seed(0)
x = np.eye(N)                                                     # one-hot features: who you are
layer = ta.nn.GraphAttention(N, 4, heads=1)
_, alpha = layer(Tensor(x), adjacency)                            # (1, N, N)

W, a_src, a_dst = layer.W.numpy(), layer.a_src.numpy()[0], layer.a_dst.numpy()[0]
Wh = x @ W.T                                                      # (N, F') every node's W h
i = 0
neighbours = np.flatnonzero(adjacency[i] | (np.arange(N) == i))   # N_i with the self loop
e = a_dst @ Wh[i] + Wh[neighbours] @ a_src                        # a . [W h_i || W h_j]
e = np.where(e > 0, e, 0.2 * e)                                   # LeakyReLU, slope 0.2
by_hand = np.exp(e - e.max()) / np.exp(e - e.max()).sum()
print("neighbours of 0:", neighbours)
print("α by hand      :", by_hand)
print("α package      :", alpha.numpy()[0, i, neighbours])
print("max |difference|:", np.abs(by_hand - alpha.numpy()[0, i, neighbours]).max())
print("weight outside N_0:", alpha.numpy()[0, i, np.setdiff1d(np.arange(N), neighbours)].sum())

# %% [markdown]
# ## Node classification from two labels
#
# Only the two leaders are labelled (node 0: Mr. Hi's side, node 33: the Officer's); the other 32
# members' sides are what we predict, the semi-supervised setting of the GAT paper. Two layers as
# in the paper's Cora model, smaller: 4 heads of 8 features, concatenated, then ELU, then one
# averaged head with 2 outputs (the classes). Full-batch Adam, 150 steps.

# %%
labelled = np.array([0, 33])
hidden_layer = ta.nn.GraphAttention(N, 8, heads=4)               # -> (N, 32)
output_layer = ta.nn.GraphAttention(32, 2, heads=1, concat=False)
optimizer = ta.optim.Adam(hidden_layer.parameters() + output_layer.parameters(), lr=1e-2)
features = Tensor(x)


def elu(h):
    """ELU(h) = h for h > 0, exp(h) - 1 otherwise (the paper's nonlinearity)."""
    return ta.where(h.numpy() > 0, h, h.exp() - 1.0)


def forward():
    h, alpha_1 = hidden_layer(features, adjacency)                # (N, 32), (4, N, N)
    logits, alpha_2 = output_layer(elu(h), adjacency)             # (N, 2), (1, N, N)
    return logits, alpha_1, alpha_2


for step in range(150):
    logits, _, _ = forward()
    loss = F.cross_entropy(logits[labelled], faction[labelled])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(f"step {step:>3}  loss {loss.item():.4f}")

with ta.no_grad():
    logits, alpha_1, alpha_2 = forward()
predicted = logits.numpy().argmax(-1)
unlabelled = np.setdiff1d(np.arange(N), labelled)
accuracy = (predicted[unlabelled] == faction[unlabelled]).mean()
wrong = unlabelled[predicted[unlabelled] != faction[unlabelled]]
print(f"accuracy on the 32 unlabelled members: {accuracy:.3f}; wrong: {wrong}")

# %% [markdown]
# ## The learned attention, drawn on the graph
#
# Each edge $\{i, j\}$ is drawn as wide as $(\alpha_{ij} + \alpha_{ji}) / 2$, the output layer's
# coefficients (left) and the hidden layer's averaged over its 4 heads (right). Node colour: the
# predicted side; a red ring marks a wrong prediction; the squares are the two labelled leaders.

# %%
layout = nx.spring_layout(G, seed=0)
colours = np.array(["tab:blue", "tab:orange"])


def draw(axes, alpha, title):
    weights = np.array([(alpha[i, j] + alpha[j, i]) / 2 for i, j in G.edges()])
    nx.draw_networkx_edges(G, layout, ax=axes, width=0.3 + 8 * weights, alpha=0.6)
    wrong = predicted != faction
    nx.draw_networkx_nodes(G, layout, ax=axes, node_color=colours[predicted], node_size=220,
                           edgecolors=np.where(wrong, "red", "white"), linewidths=np.where(wrong, 2.5, 0.5))
    nx.draw_networkx_nodes(G, layout, nodelist=list(labelled), ax=axes, node_shape="s", node_size=320,
                           node_color=colours[faction[labelled]])
    nx.draw_networkx_labels(G, layout, ax=axes, font_size=7)
    axes.set_title(title)
    axes.axis("off")


figure, (left, right) = plt.subplots(1, 2, figsize=(11, 5))
draw(left, alpha_2.numpy()[0], "output layer: α (edge width)")
draw(right, alpha_1.numpy().mean(0), "hidden layer: α averaged over 4 heads")
figure.tight_layout()
plt.show()

# %% [markdown]
# ## What to check
#
# The accuracy above, and where the attention goes: the share of each member's output-layer
# attention that stays on its own side (excluding itself), averaged over members, against the
# share of its friends who are on its side (what uniform attention over neighbours would give).

# %%
alpha_out = alpha_2.numpy()[0] * (1 - np.eye(N))                  # drop the self loops
same_side = faction[:, None] == faction[None, :]
attention_share = ((alpha_out * same_side).sum(1) / alpha_out.sum(1)).mean()
friend_share = ((adjacency * same_side).sum(1) / adjacency.sum(1)).mean()
print(f"attention on one's own side: {attention_share:.3f}   friends on one's own side: {friend_share:.3f}")
print(f"accuracy on the unlabelled members: {accuracy:.3f}")
